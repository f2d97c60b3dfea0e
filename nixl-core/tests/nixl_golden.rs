//! A metadata blob captured from a stock NIXL 1.5.1 agent (PyPI nixl-cu13, Python API, UCX
//! backend, one 4 KiB DRAM registration; `get_agent_metadata()`), decoded and re-encoded to
//! the same bytes.

use nixl_core::nixl_wire::NixlMetadata;
use nixl_core::MemKind;

#[test]
fn nixl_1_5_1_blob_decodes_and_reencodes_byte_for_byte() {
    let blob = include_bytes!("data/nixl-1.5.1-ucx-dram.bin");
    let md = NixlMetadata::decode_bytes(blob).expect("a real NIXL blob decodes");
    assert_eq!(md.name, "py0");
    assert_eq!(md.conns.len(), 1);
    assert_eq!(md.conns[0].backend, "UCX");
    // One UCX worker address (UCX 1.23 from the wheel: address v1 with the release trailer).
    assert_eq!(md.conns[0].info.len(), 213);
    assert_eq!(md.sections.len(), 1);
    let s = &md.sections[0];
    assert_eq!((s.backend.as_str(), s.kind), ("UCX", MemKind::Dram));
    assert_eq!(s.descs.len(), 1);
    assert_eq!((s.descs[0].len, s.descs[0].dev_id), (4096, 0));
    // The raw packed rkey: u64 md_map, u8 memory type, per-md rkeys, then the sys_dev byte.
    assert_eq!(s.descs[0].public.len(), 11);
    assert_eq!(md.encode(), blob.to_vec());
}
