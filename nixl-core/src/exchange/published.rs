//! What every store-based exchange (etcd, a c10d TCPStore) checks of the metadata it
//! publishes and fetches: labels, that what it publishes is its agent's own, that what a
//! peer's key holds is that peer's, and which format it publishes.

use crate::agent::remote::MetadataSelection;
use crate::agent::Agent;
use crate::error::{Error, Op, Result};
use crate::nixl_wire::agent::metadata_identity;
use crate::nixl_wire::is_nixl_blob;

/// The label full metadata is published under.
pub const DEFAULT_LABEL: &str = "metadata";
/// Longest label accepted.
pub const MAX_LABEL: usize = 256;

/// Refuses an empty label or one over [`MAX_LABEL`].
pub(crate) fn check_label(agent: &str, label: &str) -> Result<()> {
    if label.is_empty() || label.len() > MAX_LABEL {
        return Err(Error::invalid(
            agent,
            Op::Exchange,
            format!("metadata label must be 1..={MAX_LABEL} bytes"),
        ));
    }
    Ok(())
}

/// The agent's full metadata, in NIXL's format (`nixl`) or nixl-rs's.
pub(crate) fn full_metadata(agent: &Agent, nixl: bool) -> Result<Vec<u8>> {
    if nixl {
        agent.nixl().local_metadata()
    } else {
        agent.local_metadata()
    }
}

/// The agent's partial metadata, in NIXL's format (`nixl`) or nixl-rs's.
pub(crate) fn partial_metadata(
    agent: &Agent,
    selection: &MetadataSelection<'_>,
    nixl: bool,
) -> Result<Vec<u8>> {
    if nixl {
        agent.nixl().local_partial_metadata(selection)
    } else {
        agent.local_partial_metadata(selection)
    }
}

fn identity(me: &str, bytes: &[u8]) -> Result<(String, Option<u64>)> {
    metadata_identity(bytes).map_err(|source| Error::Decode {
        agent: me.to_owned(),
        op: Op::Exchange,
        source,
    })
}

/// Refuses bytes that are not `agent`'s own current metadata ([`Error::Decode`] /
/// [`Error::Mismatch`]): an exchange never publishes another agent's, or an old
/// incarnation's.
pub(crate) fn check_own(agent: &Agent, metadata: &[u8]) -> Result<()> {
    let me = agent.name();
    let (name, generation) = identity(me, metadata)?;
    let ours = match generation {
        // NIXL blobs carry no generation of ours: the name is all there is to check.
        _ if is_nixl_blob(metadata) => name == me,
        Some(g) => name == me && g == agent.generation(),
        None => false,
    };
    if !ours {
        return Err(Error::mismatch(
            me,
            Op::Exchange,
            format!("metadata of {name} (generation {generation:?}) is not this agent's"),
        ));
    }
    Ok(())
}

/// Refuses a value at `key` that is not `remote`'s metadata ([`Error::Decode`] /
/// [`Error::Mismatch`]; nothing loaded).
pub(crate) fn check_holder(agent: &Agent, remote: &str, key: &str, value: &[u8]) -> Result<()> {
    let me = agent.name();
    let (name, _) = identity(me, value)?;
    if name != remote {
        return Err(Error::mismatch(
            me,
            Op::Exchange,
            format!("key {key} holds metadata of {name}"),
        ));
    }
    Ok(())
}

/// Refuses a fetch of an empty name or of the agent itself.
pub(crate) fn check_fetch(agent: &Agent, remote: &str, label: &str) -> Result<()> {
    let me = agent.name();
    if remote.is_empty() {
        return Err(Error::invalid(me, Op::Exchange, "empty agent name"));
    }
    if remote == me {
        return Err(Error::not_allowed(
            me,
            Op::Exchange,
            "an agent cannot fetch its own metadata",
        ));
    }
    check_label(me, label)
}
