//! What the backends' fuzz targets share: the input mutator, metadata of a fresh peer with one
//! backend and at most one region (the bytes a hostile peer controls go in through it), and the
//! per-process counters file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

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

/// Bytes of a counters record: every write is this long, so the file never shrinks.
pub const STATS_RECORD: usize = 512;

/// Writes `line` (space-separated `name value` pairs) as this process's counters record in
/// file `<pid>` of directory `dir` (the first call's), over the previous record. The file is
/// opened once and each record is written in place at one length (padded with spaces, ending
/// in a newline): rewriting the file per input (truncate, then write) frees and allocates its
/// block each time, which on a filesystem mounted with `discard` waits on the disk for every
/// input (two fuzzers doing so on the 2-core CI machine took up to 59 s per input). A line
/// longer than a record is cut; a failed write is dropped (the counters are best effort).
pub fn write_stats(dir: &Path, line: &str) {
    static FILE: OnceLock<Option<File>> = OnceLock::new();
    let file = FILE.get_or_init(|| File::create(dir.join(std::process::id().to_string())).ok());
    let Some(file) = file else { return };
    let mut rec = [b' '; STATS_RECORD];
    let line = line.trim_end().as_bytes();
    let n = line.len().min(STATS_RECORD - 1);
    rec[..n].copy_from_slice(&line[..n]);
    rec[STATS_RECORD - 1] = b'\n';
    let _ = file.write_all_at(&rec, 0);
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

    #[test]
    fn the_counters_record_is_rewritten_in_place_at_one_length() {
        let dir = std::env::temp_dir().join(format!("nixl-fuzz-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_stats(&dir, "inputs 1000 loaded 12\n");
        write_stats(&dir, "inputs 7 loaded 3\n");
        let text = std::fs::read_to_string(dir.join(std::process::id().to_string())).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text.len(), STATS_RECORD);
        assert_eq!(
            text.split_whitespace().collect::<Vec<_>>(),
            ["inputs", "7", "loaded", "3"]
        );
    }
}
