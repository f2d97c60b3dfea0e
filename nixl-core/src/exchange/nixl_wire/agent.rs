//! The agent's side of NIXL's metadata: producing NIXL blobs from the agent's backends and
//! registrations, and turning a peer's blob into the agent's own loading form.

use super::metadata::NixlConn;

/// The generation given to a NIXL peer: a hash of its connection info (a NIXL blob carries
/// none, and a restarted NIXL process has new worker addresses).
pub(crate) fn derived_generation(conns: &[NixlConn]) -> u64 {
    let mut sorted: Vec<&NixlConn> = conns.iter().collect();
    sorted.sort_by(|a, b| a.backend.cmp(&b.backend));
    let mut bytes = Vec::new();
    for c in sorted {
        bytes.extend_from_slice(&(c.backend.len() as u64).to_le_bytes());
        bytes.extend_from_slice(c.backend.as_bytes());
        bytes.extend_from_slice(&(c.info.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&c.info);
    }
    xxhash_rust::xxh3::xxh3_64(&bytes).max(1)
}

/// The name and generation a metadata blob of either format carries; `None` as generation
/// for a NIXL blob without connection info (it cannot tell its incarnation).
pub(crate) fn metadata_identity(
    bytes: &[u8],
) -> std::result::Result<(String, Option<u64>), crate::error::DecodeError> {
    if super::is_nixl_blob(bytes) {
        let md = super::metadata::NixlMetadata::decode_bytes(bytes)?;
        let g = (!md.conns.is_empty()).then(|| derived_generation(&md.conns));
        Ok((md.name, g))
    } else {
        let md = crate::codec::AgentMetadata::decode_bytes(crate::auth::unsealed(bytes)?)?;
        Ok((md.name, Some(md.generation)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_depends_on_connection_info_only() {
        let c = |b: &str, i: &[u8]| NixlConn {
            backend: b.into(),
            info: i.to_vec(),
        };
        let g1 = derived_generation(&[c("UCX", b"abc"), c("X", b"1")]);
        assert_eq!(g1, derived_generation(&[c("X", b"1"), c("UCX", b"abc")]));
        assert_ne!(g1, derived_generation(&[c("UCX", b"abd"), c("X", b"1")]));
        assert_ne!(
            derived_generation(&[c("UC", b"Xabc")]),
            derived_generation(&[c("UCX", b"abc")])
        );
        assert_ne!(derived_generation(&[]), 0);
    }
}
