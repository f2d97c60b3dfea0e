//! The agents of this process, by name and generation: metadata that names this very
//! process is believed only when it is one of them, with its own registrations.
//!
//! A peer's metadata says which process it runs in and where its memory is; for another
//! process that is a claim the transports bound (a key the NIC checks, a process the kernel
//! tells apart). For this process it is not: UCX's emulated puts through a worker of this
//! process, or a copy into this process, write wherever the metadata says. So a load of
//! metadata naming this process (`LoadPlan::validate`) finds the agent it claims to be here
//! and refuses every region that agent has not registered.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::shared::Shared;
use crate::codec::AgentMetadata;
use crate::error::{Error, Op, Result};

/// An agent's generation, name and handle.
type Entry = (u64, Arc<str>, Weak<Shared>);

static HERE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Adds a new agent.
pub(super) fn add(shared: &Arc<Shared>) {
    let mut here = HERE.lock();
    here.retain(|(_, _, w)| w.strong_count() > 0);
    here.push((
        shared.generation,
        Arc::from(shared.name.as_str()),
        Arc::downgrade(shared),
    ));
}

/// Removes a dropping agent.
pub(super) fn remove(shared: &Shared) {
    let me: *const Shared = shared;
    HERE.lock()
        .retain(|(_, _, w)| !std::ptr::eq(w.as_ptr(), me));
}

/// The live agent of this process with `name` and `generation`. Upgraded after the list's
/// lock is released: an agent whose last handle went meanwhile drops here, and its drop takes
/// the lock (`remove`).
fn find(name: &str, generation: u64) -> Option<Arc<Shared>> {
    let found = HERE
        .lock()
        .iter()
        .find(|(g, n, _)| *g == generation && **n == *name)
        .map(|(_, _, w)| w.clone());
    found?.upgrade()
}

/// Refuses metadata that names this process (`me`) unless it is a live agent of this process
/// (name and generation) and each of its regions lies in that agent's live registrations.
pub(super) fn check(
    agent: &str,
    me: Option<&crate::liveness::ProcessId>,
    md: &AgentMetadata,
) -> Result<()> {
    let (Some(me), Some(claim)) = (me, md.process.as_ref()) else {
        return Ok(());
    };
    if me != claim {
        return Ok(());
    }
    let refuse = |why: String| Error::not_allowed(agent, Op::LoadMetadata, why);
    let Some(owner) = find(&md.name, md.generation) else {
        return Err(refuse(format!(
            "metadata of {} names this process, which has no agent {} of generation {:#x}: refused",
            md.name, md.name, md.generation
        )));
    };
    let regs = owner.regs.lock();
    for r in &md.regions {
        let d = &r.desc;
        if regs.find(d.kind, d.dev_id, d.addr, d.len).is_none() {
            return Err(refuse(format!(
                "metadata of {} (an agent of this process) names a {:?} region at {:#x} of {} \
                 bytes that it has not registered: refused",
                md.name, d.kind, d.addr, d.len
            )));
        }
    }
    Ok(())
}
