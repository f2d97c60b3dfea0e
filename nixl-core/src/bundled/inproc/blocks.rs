//! `INPROC` block-table transfers: the layers and id runs are kept as they are and walked on
//! each post (a dense run is one copy), so nothing is stored per block and the target's
//! regions are checked once per layer.

use std::sync::Weak;

use super::{Endpoint, InprocBackend, LocalMd, TargetMd};
use crate::backend::{downcast_md, BackendXfer, BlockRun, BlockXferSpec, XferState};
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};
use crate::mem::MemKind;
use crate::strided::StridedDesc;

/// One layer: both sides' runs and the target's region id.
struct Layer {
    local: StridedDesc,
    remote: StridedDesc,
    dense: bool,
    region: u64,
}

pub(super) struct InprocBlocks {
    agent: String,
    remote: String,
    op: XferOp,
    layers: Vec<Layer>,
    runs: Vec<BlockRun>,
    target: Weak<Endpoint>,
    notif: Option<Vec<u8>>,
}

pub(super) fn prepare(b: &InprocBackend, spec: &BlockXferSpec) -> Result<InprocBlocks> {
    if spec.local_kind != MemKind::Dram || spec.remote_kind != MemKind::Dram {
        return Err(Error::not_supported(
            &b.agent,
            Op::MakeXfer,
            "INPROC moves DRAM only",
        ));
    }
    let mut target: Option<Weak<Endpoint>> = None;
    let mut layers = Vec::with_capacity(spec.layers.len());
    for l in &spec.layers {
        let t = downcast_md::<TargetMd>(&l.remote_md).ok_or_else(|| {
            Error::invalid(&b.agent, Op::MakeXfer, "remote metadata is not INPROC's")
        })?;
        downcast_md::<LocalMd>(&l.local_md).ok_or_else(|| {
            Error::invalid(&b.agent, Op::MakeXfer, "local metadata is not INPROC's")
        })?;
        target.get_or_insert_with(|| t.ep.clone());
        layers.push(Layer {
            local: l.local,
            remote: l.remote,
            dense: l.is_dense(),
            region: t.region,
        });
    }
    let target = target.ok_or_else(|| Error::invalid(&b.agent, Op::MakeXfer, "no layers"))?;
    Ok(InprocBlocks {
        agent: b.agent.clone(),
        remote: spec.remote.clone(),
        op: spec.op,
        layers,
        runs: spec.runs.clone(),
        target,
        notif: spec.notif.clone(),
    })
}

impl InprocBlocks {
    /// Copies one contiguous piece in the request's direction.
    fn copy(&self, laddr: u64, raddr: u64, len: u64) {
        let (src, dst) = match self.op {
            XferOp::Write => (laddr, raddr),
            XferOp::Read => (raddr, laddr),
        };
        // SAFETY: the local range lies in a registration the request keeps alive (the agent
        // checked the layer against it and every id against the layer); the remote range lies
        // in a layer `post` checked as still registered, under the read lock that keeps it
        // registered until the copies end. `copy` tolerates overlap for loopback transfers.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
    }
}

/// Whether every remote layer `(run, region id)` still lies in its registered region of the
/// target (`regions`: id -> (addr, len), read-locked by the caller for its copies).
pub(super) fn layers_registered<'a>(
    regions: &std::collections::HashMap<u64, (u64, u64)>,
    mut layers: impl Iterator<Item = (&'a StridedDesc, u64)>,
) -> bool {
    layers.all(|(run, region)| {
        let end = run.end().unwrap_or(u64::MAX);
        matches!(regions.get(&region), Some(&(a, n)) if run.addr >= a && end <= a.saturating_add(n))
    })
}

impl BackendXfer for InprocBlocks {
    fn post(&mut self) -> Result<XferState> {
        let ep = self.target.upgrade().ok_or_else(|| {
            Error::disconnected(
                &self.agent,
                &self.remote,
                Op::PostXfer,
                "peer endpoint is gone",
            )
        })?;
        let regions = ep.regions.read();
        if !layers_registered(&regions, self.layers.iter().map(|l| (&l.remote, l.region))) {
            return Err(Error::disconnected(
                &self.agent,
                &self.remote,
                Op::PostXfer,
                "target region was deregistered",
            ));
        }
        crate::work::tick(self.layers.len() * (1 + self.runs.len()));
        for l in &self.layers {
            for r in &self.runs {
                // In bounds: ids were checked against the layer's count.
                let la = l.local.addr + r.local * l.local.stride;
                let ra = l.remote.addr + r.remote * l.remote.stride;
                if l.dense {
                    self.copy(la, ra, r.count * l.local.len);
                    continue;
                }
                for k in 0..r.count {
                    self.copy(
                        la + k * l.local.stride,
                        ra + k * l.remote.stride,
                        l.local.len,
                    );
                }
            }
        }
        drop(regions);
        if let Some(n) = &self.notif {
            ep.notifs.push(&self.agent, n.clone());
        }
        Ok(XferState::Done)
    }

    fn check(&mut self) -> Result<XferState> {
        Ok(XferState::Done)
    }

    fn cancel(&mut self) -> Result<()> {
        // Copies finish inside `post`; nothing is ever in flight.
        Ok(())
    }

    fn path(&self) -> Option<String> {
        Some("in-process memcpy".to_owned())
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        self.notif = msg.map(<[u8]>::to_vec);
        Ok(())
    }
}
