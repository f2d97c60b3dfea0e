//! GPU test of block tables through `CUDA_IPC` (one process, two agents, VRAM on GPU 0):
//! split and interleaved K/V layouts, WRITE and READ, scattered block ids and runs of
//! consecutive ones; the backend consumes the strides with the block-table copy kernel (the
//! path says so) and every byte of both buffers is verified. Skips with a
//! printed reason where no CUDA GPU is usable.

use nixl_testkit::gpu as common;

use std::sync::Arc;
use std::time::Duration;

use common::{first_diff, gpu, pattern};
use nixl_core::backend::RawRegion;
use nixl_core::{
    Agent, AgentConfig, MemKind, MemoryRegion, RegionDesc, StridedDesc, StridedDescList, XferOp,
    XferOptions, XferTarget,
};
use nixl_mem::{CudaIpcParams, DeviceBuffer, CUDA_IPC};

const LAYERS: u64 = 4;
const POOL: u64 = 48;
const BLOCK: u64 = 16 << 10;

struct Side {
    buf: Arc<DeviceBuffer>,
    _reg: nixl_core::Registration,
    table: StridedDescList,
}

fn side(a: &Agent, seed: u64, interleaved: bool) -> Side {
    let layer = 2 * POOL * BLOCK;
    let buf = Arc::new(DeviceBuffer::new(0, (LAYERS * layer) as usize).unwrap());
    buf.copy_from_host(0, &pattern(seed, (LAYERS * layer) as usize))
        .unwrap();
    let views: Vec<Arc<dyn MemoryRegion>> = (0..LAYERS)
        .map(|l| {
            // SAFETY: inside `buf`, which the side keeps until after the registration.
            let r = unsafe { RawRegion::new(RegionDesc::vram(buf.addr() + l * layer, layer, 0)) };
            Arc::new(r) as Arc<dyn MemoryRegion>
        })
        .collect();
    let reg = a.register_mem(views, &[]).unwrap();
    let mut table = StridedDescList::new(MemKind::Vram);
    for l in 0..LAYERS {
        let at = buf.addr() + l * layer;
        for kv in 0..2 {
            table.push(if interleaved {
                StridedDesc::on_device(at + kv * BLOCK, 2 * BLOCK, BLOCK, POOL, 0)
            } else {
                StridedDesc::on_device(at + kv * POOL * BLOCK, BLOCK, BLOCK, POOL, 0)
            });
        }
    }
    Side {
        buf,
        _reg: reg,
        table,
    }
}

/// The destination's expected bytes after moving `from[k] -> to[k]` in every layer.
fn expected(src: &Side, s: &[u8], dst: &Side, d: &[u8], from: &[usize], to: &[usize]) -> Vec<u8> {
    let mut want = d.to_vec();
    for (a, b) in src.table.descs().iter().zip(dst.table.descs()) {
        for (&i, &j) in from.iter().zip(to) {
            let x = (a.block(i as u64).unwrap().addr - src.buf.addr()) as usize;
            let y = (b.block(j as u64).unwrap().addr - dst.buf.addr()) as usize;
            want[y..y + BLOCK as usize].copy_from_slice(&s[x..x + BLOCK as usize]);
        }
    }
    want
}

#[test]
fn gpu_block_tables_through_cuda_ipc() {
    if !gpu("gpu_block_tables_through_cuda_ipc") {
        return;
    }
    let lids = [5usize, 6, 7, 30, 2, 3, 47, 0, 11];
    let rids = [40usize, 41, 42, 1, 20, 21, 9, 33, 12];
    for interleaved in [false, true] {
        for op in [XferOp::Write, XferOp::Read] {
            let a =
                Agent::new(&format!("gb-a-{interleaved}-{op}"), AgentConfig::default()).unwrap();
            let b =
                Agent::new(&format!("gb-b-{interleaved}-{op}"), AgentConfig::default()).unwrap();
            assert_eq!(
                a.create_backend(CudaIpcParams::default()).unwrap().name(),
                CUDA_IPC
            );
            assert_eq!(
                b.create_backend(CudaIpcParams::default()).unwrap().name(),
                CUDA_IPC
            );
            let (ls, rs) = (side(&a, 1, interleaved), side(&b, 2, interleaved));
            let peer = a
                .load_remote_metadata(&b.local_metadata().unwrap())
                .unwrap();
            let l = a
                .prep_strided_dlist(XferTarget::Initiator, &ls.table, &[])
                .unwrap();
            let r = a
                .prep_strided_dlist(XferTarget::Agent(&peer), &rs.table, &[])
                .unwrap();
            let (lb, rb) = (ls.buf.to_vec().unwrap(), rs.buf.to_vec().unwrap());
            let req = a
                .make_block_xfer(op, &l, &lids, &r, &rids, XferOptions::default())
                .unwrap();
            let path = req.path();
            eprintln!("block table {op} interleaved={interleaved}: {path}");
            assert!(path.contains("strided"), "{path}");
            // Generated on the device from the layers and the ids (nothing per block built on
            // the host); posted twice (the repost reuses the uploaded table).
            assert!(path.contains("block-table copy kernel"), "{path}");
            a.post_xfer_req(&req).unwrap();
            req.wait(Duration::from_secs(30)).unwrap();
            a.post_xfer_req(&req).unwrap();
            req.wait(Duration::from_secs(30)).unwrap();
            let (la, ra) = (ls.buf.to_vec().unwrap(), rs.buf.to_vec().unwrap());
            match op {
                XferOp::Write => {
                    assert_eq!(
                        first_diff(&ra, &expected(&ls, &lb, &rs, &rb, &lids, &rids)),
                        None
                    );
                    assert_eq!(first_diff(&la, &lb), None, "source changed");
                }
                XferOp::Read => {
                    assert_eq!(
                        first_diff(&la, &expected(&rs, &rb, &ls, &lb, &rids, &lids)),
                        None
                    );
                    assert_eq!(first_diff(&ra, &rb), None, "source changed");
                }
            }
        }
    }
}
