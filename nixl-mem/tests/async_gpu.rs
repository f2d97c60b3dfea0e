//! Async completion over CUDA_IPC (issue 27): a request's future is woken by a host function
//! the driver runs after the post's copies (`cuLaunchHostFunc`, queued by the future's first
//! poll: a blocking caller does not pay for it), and, with a notification,
//! by the completer once it is sent; not by a timer. Skips as `gpu` without a CUDA GPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::{Agent, AgentConfig, Desc, MemKind, XferDescList, XferOp, XferOptions};
use nixl_mem::{CudaIpcParams, DeviceBuffer};
use nixl_testkit::executor::{block_on, next};
use nixl_testkit::gpu::gpu;

const WAIT: Duration = Duration::from_secs(60);

fn agent(name: &str) -> Agent {
    let a = Agent::new(
        &format!("{name}-{}", std::process::id()),
        AgentConfig::default(),
    )
    .unwrap();
    a.create_backend(CudaIpcParams::default()).unwrap();
    a
}

#[test]
fn cuda_ipc_future_is_woken_after_the_copies() {
    if !gpu("cuda_ipc_future_is_woken_after_the_copies") {
        return;
    }
    let (a, b) = (agent("gpu-async-a"), agent("gpu-async-b"));
    const LEN: usize = 1 << 30;
    let (src, dst) = (
        Arc::new(DeviceBuffer::new(0, LEN).unwrap()),
        Arc::new(DeviceBuffer::new(0, LEN).unwrap()),
    );
    src.fill(0x77).unwrap();
    dst.fill(0).unwrap();
    let _ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    b.load_remote_metadata(&a.local_metadata().unwrap())
        .unwrap();
    // 256 pieces of 4 MiB: the copy kernel.
    let piece = (LEN / 256) as u64;
    let l = XferDescList::from_descs(
        MemKind::Vram,
        (0..256).map(|i| Desc::on_device(src.addr() + i * piece, piece, 0)),
    );
    let r = XferDescList::from_descs(
        MemKind::Vram,
        (0..256).map(|i| Desc::on_device(dst.addr() + i * piece, piece, 0)),
    );
    for notif in [None, Some(b"gpu-done".to_vec())] {
        let req = a
            .create_xfer_req(
                XferOp::Write,
                &l,
                &r,
                b.name(),
                XferOptions::default().notif(notif.clone()),
            )
            .unwrap();
        let mut stream = b.notif_stream().idle_timeout(Duration::from_secs(20));
        let mut best = Duration::MAX;
        let mut most = 0;
        for _ in 0..5 {
            let t = Instant::now();
            a.post_xfer_req(&req).unwrap();
            let (res, polls) = block_on(req.completion());
            res.unwrap();
            best = best.min(t.elapsed());
            most = most.max(polls);
            if notif.is_some() {
                let (item, _) = block_on(next(&mut stream));
                assert_eq!(item.unwrap().unwrap().message, b"gpu-done");
            }
        }
        assert!(dst.to_vec().unwrap().iter().all(|&x| x == 0x77));
        println!(
            "cuda_ipc 1 GiB in 256 pieces (notification: {}): awaited in {best:?} best, at most {most} polls; path: {}",
            notif.is_some(),
            req.path()
        );
        // Woken by the backend: a first poll (pending; it arms the host function), then one
        // after the copies (a third where the notification's wake comes apart from the
        // data's). The recheck timer alone (50 us, doubling) would take five polls or more.
        assert!(
            most <= 3,
            "{most} polls: the backend's wake did not end the wait, a timer did"
        );
    }
}

/// The initiator's GPU waits for the request on the GPU: a stream gated on the request
/// (`nixl_mem::cuda_ipc::gate_stream`) finishes only after the copies, so work queued on it reads
/// the landed bytes; the CPU never waits for the request first. The same with the typed event's
/// raw `CUevent` handed to `cuStreamWaitEvent` directly (an application's own CUDA code).
#[test]
fn a_gpu_stream_gated_on_the_request_runs_after_its_copies() {
    if !gpu("a_gpu_stream_gated_on_the_request_runs_after_its_copies") {
        return;
    }
    let (a, b) = (agent("gate-a"), agent("gate-b"));
    const LEN: usize = 1 << 30;
    let (src, dst) = (
        Arc::new(DeviceBuffer::new(0, LEN).unwrap()),
        Arc::new(DeviceBuffer::new(0, LEN).unwrap()),
    );
    let _ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let l = XferDescList::from_descs(MemKind::Vram, [Desc::on_device(src.addr(), LEN as u64, 0)]);
    let r = XferDescList::from_descs(MemKind::Vram, [Desc::on_device(dst.addr(), LEN as u64, 0)]);
    let req = a
        .create_xfer_req(XferOp::Write, &l, &r, b.name(), XferOptions::default())
        .unwrap();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    for (round, byte) in [0x11u8, 0x22, 0x33].into_iter().enumerate() {
        src.fill(byte).unwrap();
        dst.fill(0).unwrap();
        a.post_xfer_req(&req).unwrap();
        if round == 1 {
            // The typed event, as an application's own CUDA code takes it: the raw `CUevent`.
            let ev = req
                .device_event()
                .expect("a CUDA_IPC request has a device event");
            assert_eq!(ev.api(), nixl_core::backend::DeviceApi::Cuda);
            assert_eq!(ev.device(), 0);
            assert_ne!(ev.raw(), 0);
            // SAFETY: a live stream and a live event (`ev` keeps it) of this process.
            let rc = unsafe {
                cudarc::driver::sys::cuStreamWaitEvent(
                    stream.cu_stream(),
                    ev.raw() as cudarc::driver::sys::CUevent,
                    0,
                )
            };
            assert_eq!(rc, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
        } else {
            nixl_mem::cuda_ipc::gate_stream(&req, &stream).unwrap();
        }
        stream.synchronize().unwrap();
        // Read the tail at once, without waiting on the request.
        let mut tail = [0u8; 4096];
        dst.copy_to_host(LEN - tail.len(), &mut tail).unwrap();
        assert!(
            tail.iter().all(|&x| x == byte),
            "round {round}: stale bytes"
        );
        req.wait(WAIT).unwrap();
    }
    // A request of another backend has no CUDA event to gate on.
    let h = Agent::new(
        &format!("gate-h-{}", std::process::id()),
        AgentConfig::default(),
    )
    .unwrap();
    h.create_backend(nixl_core::InprocParams::default())
        .unwrap();
    let hb = Arc::new(nixl_core::HostBuffer::new(64).unwrap());
    let _rh = h.register_mem(vec![hb.clone()], &[]).unwrap();
    let d = XferDescList::from_descs(MemKind::Dram, [Desc::new(hb.addr(), 32)]);
    let d2 = XferDescList::from_descs(MemKind::Dram, [Desc::new(hb.addr() + 32, 32)]);
    let hr = h
        .create_xfer_req(XferOp::Write, &d, &d2, h.name(), XferOptions::default())
        .unwrap();
    assert!(hr.device_event().is_none(), "INPROC has no device event");
    assert_eq!(
        nixl_mem::cuda_ipc::gate_stream(&hr, &stream)
            .unwrap_err()
            .kind(),
        nixl_core::ErrorKind::NotSupported
    );
}
