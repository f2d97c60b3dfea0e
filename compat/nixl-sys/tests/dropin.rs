//! The drop-in beyond nixl-sys's own tests: what a nixl-sys program relies on, and what
//! nixl-rs adds (typed reports, memory kept alive, refusals instead of silent no-ops).

use nixl_sys::*;

fn ucx_agent(name: &str) -> (Agent, OptArgs) {
    let agent = Agent::new(name).expect("agent");
    let (_m, params) = agent.get_plugin_params("UCX").expect("params");
    let b = agent.create_backend("UCX", &params).expect("UCX backend");
    let mut opt = OptArgs::new().expect("opt");
    opt.add_backend(&b).expect("add");
    (agent, opt)
}

#[test]
fn partial_metadata_of_a_registration_is_sent() {
    let (agent, opt) = ucx_agent("partial-sender");
    let mut s = SystemStorage::new(4096).expect("storage");
    s.register(&agent, Some(&opt)).expect("register");
    let mut descs = RegDescList::new(MemType::Dram).expect("list");
    descs.add_storage_desc(&s).expect("desc");
    let md = agent.get_local_partial_md(&descs, Some(&opt));
    assert!(md.is_ok(), "{md:?} {:?}", last_error());
}

/// nixl-sys's test helpers register one storage twice and drop the second handle: the first
/// registration stays, and so does its partial metadata.
#[test]
fn a_second_registration_dropped_leaves_the_first() {
    let (agent, opt) = ucx_agent("twice");
    let mut s = SystemStorage::new(4096).expect("storage");
    s.register(&agent, Some(&opt)).expect("register");
    drop(agent.register_memory(&s, Some(&opt)).expect("again"));
    let mut descs = RegDescList::new(MemType::Dram).expect("list");
    descs.add_storage_desc(&s).expect("desc");
    let md = agent.get_local_partial_md(&descs, Some(&opt));
    assert!(md.is_ok(), "{md:?} {:?}", last_error());
    let mut other = RegDescList::new(MemType::Dram).expect("list");
    other.add_desc(0x1000, 16, 0);
    assert!(matches!(
        agent.get_local_partial_md(&other, None),
        Err(NixlError::NotFound)
    ));
    assert_eq!(last_error().map(|e| e.kind), Some(nixl::ErrorKind::NotFound));
}
