//! What the backends' fuzz targets share: the input mutator, and metadata of a fresh peer with
//! one backend and at most one region (the bytes a hostile peer controls go in through it).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::mem::{MemKind, RegionDesc};
use crate::wire::codec::{AgentMetadata, BackendEntry, RegionEntry};

/// Applies an input to a base: byte 0 picks the mode; then `(offset, xor)` pairs edit the
/// base, or (raw mode) the rest of the input replaces it; a final length byte may truncate
/// or extend.
pub fn mutate(base: &[u8], data: &[u8]) -> Vec<u8> {
    let Some((&mode, rest)) = data.split_first() else {
        return base.to_vec();
    };
    if mode & 0x80 != 0 {
        return rest.to_vec();
    }
    let mut out = base.to_vec();
    let mut it = rest.chunks_exact(2);
    for pair in &mut it {
        if out.is_empty() {
            break;
        }
        let i = usize::from(pair[0]) % out.len();
        out[i] ^= pair[1];
    }
    if let [len] = it.remainder() {
        let n = usize::from(*len);
        if mode & 0x40 != 0 {
            out.truncate(n.min(out.len()));
        } else if mode & 0x20 != 0 {
            out.extend(std::iter::repeat_n(*len, n % 17));
        }
    }
    out
}

static SEQ: AtomicU64 = AtomicU64::new(1);

/// Metadata of a fresh peer name (`fuzz-peer-<n>`) with one backend `backend` (its connection
/// info `conn_info`) and optionally one DRAM region `(public bytes, (addr, len))`: the name and
/// the encoded blob.
pub fn peer_metadata(
    backend: &str,
    conn_info: Vec<u8>,
    region: Option<(Vec<u8>, (u64, u64))>,
) -> (String, Vec<u8>) {
    let name = format!("fuzz-peer-{}", SEQ.fetch_add(1, Ordering::Relaxed));
    let regions = region
        .map(|(public, (addr, len))| RegionEntry {
            label: String::new(),
            backend: 0,
            desc: RegionDesc {
                kind: MemKind::Dram,
                addr,
                len,
                dev_id: 0,
                meta: Vec::new(),
            },
            public,
        })
        .into_iter()
        .collect();
    let md = AgentMetadata {
        name: name.clone(),
        generation: 1,
        has_conn_info: true,
        process: None,
        verifies_integrity: false,
        hello_key: None,
        succession: None,
        backends: vec![BackendEntry {
            name: backend.into(),
            conn_info,
        }],
        regions,
    };
    (name, md.encode())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mutator_edits_replaces_truncates_and_extends() {
        let base = [1u8, 2, 3, 4];
        assert_eq!(mutate(&base, &[]), base);
        assert_eq!(mutate(&base, &[0x80, 9, 9]), [9, 9]);
        assert_eq!(mutate(&base, &[0, 1, 0xff]), [1, 0xfd, 3, 4]);
        assert_eq!(mutate(&base, &[0x40, 2]), [1, 2]);
        assert_eq!(mutate(&base, &[0x20, 3]), [1, 2, 3, 4, 3, 3, 3]);
        let (name, blob) = peer_metadata("UCX", vec![7], Some((vec![1], (4096, 8))));
        let md = AgentMetadata::decode(&blob).unwrap();
        assert_eq!(
            (md.name, md.backends[0].name.as_str(), md.regions.len()),
            (name, "UCX", 1)
        );
    }
}
