//! `INPROC` block-table transfers, whole blocks and tiles alike: the layers and runs are kept
//! as they are and walked on each post (for whole blocks a dense run is one copy; a tile's
//! rows are each copied where the destination wants them: the reference the copy kernel's
//! tests compare against, and a permute for single-process pipelines), so nothing is stored
//! per block and the target's regions are checked once per layer.

// Exception to the crate's `deny(unsafe_code)`: INPROC's block and tile copies by address,
// inside registrations the request holds (SAFETY at the copy).
#![allow(unsafe_code)]

use std::sync::Weak;

use super::{Endpoint, InprocBackend, LocalMd, TargetMd};
use crate::backend::{downcast_md, BackendXfer, BlockXferSpec, XferState};
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};
use crate::mem::MemKind;
use crate::strided::StridedDesc;

pub(super) struct InprocBlocks {
    agent: String,
    spec: BlockXferSpec,
    /// The target's region id per layer.
    regions: Vec<u64>,
    target: Weak<Endpoint>,
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
    let mut regions = Vec::with_capacity(spec.layers.len());
    for l in &spec.layers {
        let t = downcast_md::<TargetMd>(&l.remote_md).ok_or_else(|| {
            Error::invalid(&b.agent, Op::MakeXfer, "remote metadata is not INPROC's")
        })?;
        downcast_md::<LocalMd>(&l.local_md).ok_or_else(|| {
            Error::invalid(&b.agent, Op::MakeXfer, "local metadata is not INPROC's")
        })?;
        target.get_or_insert_with(|| t.ep.clone());
        regions.push(t.region);
    }
    let target = target.ok_or_else(|| Error::invalid(&b.agent, Op::MakeXfer, "no layers"))?;
    Ok(InprocBlocks {
        agent: b.agent.clone(),
        spec: spec.clone(),
        regions,
        target,
    })
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
                &self.spec.remote,
                Op::PostXfer,
                "peer endpoint is gone",
            )
        })?;
        let regions = ep.regions.read();
        let layers = self
            .spec
            .layers
            .iter()
            .map(|l| &l.remote)
            .zip(self.regions.iter().copied());
        if !layers_registered(&regions, layers) {
            return Err(Error::disconnected(
                &self.agent,
                &self.spec.remote,
                Op::PostXfer,
                "target region was deregistered",
            ));
        }
        crate::work::tick(self.spec.layers.len() * (1 + self.spec.runs.len()));
        let op = self.spec.op;
        for (_, la, ra, len) in self.spec.segments() {
            let (src, dst) = match op {
                XferOp::Write => (la, ra),
                XferOp::Read => (ra, la),
            };
            // SAFETY: the local range lies in a registration the request keeps alive (the
            // agent checked the layer against it, every id against the layer and every tile
            // inside its block); the remote range lies in a layer checked above as still
            // registered, under the read lock that keeps it registered until the copies end.
            // `copy` tolerates overlap for loopback transfers (the agent refused tile
            // destinations meeting sources on one agent anyway).
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        }
        drop(regions);
        if let Some(n) = &self.spec.notif {
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
        Some(match self.spec.rows {
            None => "in-process memcpy".to_owned(),
            Some(_) => "in-process row copy (tiles)".to_owned(),
        })
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        self.spec.notif = msg.map(<[u8]>::to_vec);
        Ok(())
    }
}
