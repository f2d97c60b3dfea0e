//! `INPROC` tile transfers: every row of every tile copied on the CPU where the destination
//! wants it (the reference the copy kernel's tests compare against, and a permute for
//! single-process pipelines).

use std::sync::Weak;

use super::{Endpoint, InprocBackend, LocalMd, TargetMd};
use crate::backend::{downcast_md, BackendXfer, XferState};
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};
use crate::mem::MemKind;
use crate::tiles::TileXferSpec;

pub(super) struct InprocTiles {
    agent: String,
    spec: TileXferSpec,
    /// The target's region id per layer.
    regions: Vec<u64>,
    target: Weak<Endpoint>,
}

pub(super) fn prepare(b: &InprocBackend, spec: &TileXferSpec) -> Result<InprocTiles> {
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
    Ok(InprocTiles {
        agent: b.agent.clone(),
        spec: spec.clone(),
        regions,
        target,
    })
}

impl BackendXfer for InprocTiles {
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
        if !super::blocks::layers_registered(&regions, layers) {
            return Err(Error::disconnected(
                &self.agent,
                &self.spec.remote,
                Op::PostXfer,
                "target region was deregistered",
            ));
        }
        let op = self.spec.op;
        self.spec.for_each_row(|_, la, ra, len| {
            let (src, dst) = match op {
                XferOp::Write => (la, ra),
                XferOp::Read => (ra, la),
            };
            // SAFETY: the local row lies in a registration the request keeps alive (the agent
            // checked every tile inside its block in every layer, and each layer against its
            // region); the remote row lies in a layer checked above as still registered, under
            // the read lock that keeps it registered until the copies end. `copy` tolerates
            // overlap (the agent refused destinations meeting sources on one agent anyway).
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        });
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
        Some("in-process row copy (tiles)".to_owned())
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        self.spec.notif = msg.map(<[u8]>::to_vec);
        Ok(())
    }
}
