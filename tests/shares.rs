//! Which loaded peers may READ and WRITE a registration (issue 34, item 5), on one host without
//! a credential: an owner shares its `kv` registration with one named peer
//! (`AgentConfig::shares`). That peer, once loaded (its PUSH, checked against the kernel's word
//! for its process), FETCHes metadata with the `kv` keys and READs them; another loaded peer
//! and a process that only claims the listed name get the rest of the metadata, no `kv`
//! keys, and a READ aimed at the `kv` memory is refused typed. Every actor is a process of its
//! own, over real UCX.

use std::sync::Arc;
use std::time::Duration;

use nixl::access::Share;
use nixl::core::wire::codec::AgentMetadata;
use nixl::core::ErrorKind;
use nixl::core::MetadataSelection;
use nixl::nixl_wire::NixlMetadata;
use nixl::ucx::UcxParams;
use nixl::{Agent, HostBuffer, MemKind, XferDescList, XferOp};
use nixl_testkit::two_process::{child_main, Child};
use nixl_testkit::ucx::ucx_or_skip;

const CHILD: &str = "reader_role";
const WAIT: Duration = Duration::from_secs(60);
const KV: usize = 64 << 10;
const PATTERN: u8 = 0xA5;

fn agent(name: &str, shares: Vec<Share>) -> Result<Agent, String> {
    let a = Agent::new(
        name,
        nixl::agent_config()
            .listen(true)
            .default_timeout(Duration::from_secs(20))
            .shares(shares),
    )
    .map_err(|e| e.to_string())?;
    a.create_backend(UcxParams::default().transports("shm,cma,self".to_string()))
        .map_err(|e| e.to_string())?;
    Ok(a)
}

/// Pushes its metadata where told (`push` = 1), fetches the owner's, and checks what it got:
/// with `kv` = 1 the `kv` region is listed and READ (every byte the owner's pattern); with
/// `kv` = 0 it is not listed and a READ of its address (`kv_addr`) is refused. Exits 0 when
/// every check held.
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn reader_role() {
    child_main(|env| {
        let a = agent(&env.name, Vec::new())?;
        if env.var("push")? == "1" {
            a.send_local_metadata(env.parent_addr)
                .map_err(|e| format!("push: {e}"))?;
        }
        a.fetch_remote_metadata_blocking(&env.parent, env.parent_addr, WAIT)
            .map_err(|e| format!("fetch: {e}"))?;
        let open = a
            .remote_regions_labeled(&env.parent, "open")
            .map_err(|e| e.to_string())?;
        if open.len() != 1 {
            return Err(format!("{} open regions, expected 1", open.len()));
        }
        let kv = a
            .remote_regions_labeled(&env.parent, "kv")
            .map_err(|e| e.to_string())?;
        let kv_addr: u64 = env
            .var("kv_addr")?
            .parse()
            .map_err(|e| format!("kv_addr: {e}"))?;
        let dst = Arc::new(HostBuffer::new(KV).ok_or("alloc")?);
        let _reg = a
            .register_mem(vec![dst.clone()], &[])
            .map_err(|e| e.to_string())?;
        let read = a.create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, dst.addr(), KV as u64, 1),
            &XferDescList::blocks(MemKind::Dram, kv_addr, KV as u64, 1),
            &env.parent,
            Default::default(),
        );
        match (env.var("kv")?.as_str(), read) {
            ("1", Ok(req)) => {
                if kv.len() != 1 || kv[0].addr != kv_addr {
                    return Err(format!("kv regions {kv:?}, expected one at {kv_addr:#x}"));
                }
                a.post_xfer_req(&req).map_err(|e| e.to_string())?;
                req.wait(WAIT).map_err(|e| format!("READ: {e}"))?;
                let mut got = vec![0u8; KV];
                dst.read_at(0, &mut got);
                if got.iter().any(|&b| b != PATTERN) {
                    return Err("the READ brought other bytes than the owner's".into());
                }
                Ok(())
            }
            ("0", Err(e)) if !kv.is_empty() => Err(format!("kv listed ({kv:?}); READ: {e}")),
            ("0", Err(e)) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidParam) => {
                eprintln!("READ of the unshared region refused as expected: {e}");
                Ok(())
            }
            (want, got) => Err(format!("kv = {want}: READ gave {got:?}, kv regions {kv:?}")),
        }
    });
}

fn labels(md: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = AgentMetadata::decode_bytes(md)
        .expect("decodes")
        .regions
        .into_iter()
        .map(|r| r.label)
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn a_shared_registration_reaches_its_listed_peers_only() {
    if !ucx_or_skip("a_shared_registration_reaches_its_listed_peers_only") {
        return;
    }
    let pid = std::process::id();
    let listed = format!("listed-{pid}");
    let owner = agent(
        &format!("share-owner-{pid}"),
        vec![Share::new("kv", &[&listed])],
    )
    .expect("owner");
    let kv = Arc::new(HostBuffer::new(KV).expect("alloc"));
    kv.fill(PATTERN);
    let open = Arc::new(HostBuffer::new(4096).expect("alloc"));
    let kv_reg = owner
        .register_mem_labeled("kv", vec![kv.clone()], &[])
        .expect("register kv");
    let _open_reg = owner
        .register_mem_labeled("open", vec![open.clone()], &[])
        .expect("register open");

    // The metadata the application builds for anyone leaves `kv` out; naming it is refused;
    // built for the listed peer it carries it.
    assert_eq!(labels(&owner.local_metadata().unwrap()), ["open"]);
    let e = owner
        .local_partial_metadata(&MetadataSelection {
            registrations: Some(&[&kv_reg]),
            include_conn: true,
        })
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
    assert_eq!(
        labels(&owner.local_metadata_for(&listed).unwrap()),
        ["kv", "open"]
    );
    assert_eq!(
        labels(&owner.local_metadata_for("someone-else").unwrap()),
        ["open"]
    );
    // NIXL's format (for stock NIXL peers, who cannot be told apart) leaves it out too.
    let nixl_md = NixlMetadata::decode(&owner.nixl().local_metadata().unwrap()).unwrap();
    let addrs: Vec<u64> = nixl_md
        .sections
        .iter()
        .flat_map(|s| s.descs.iter().map(|d| d.addr))
        .collect();
    assert_eq!(
        addrs,
        [open.addr()],
        "NIXL-format metadata carries only the open region"
    );

    let kv_addr = kv.addr().to_string();
    let run = |name: &str, push: bool, sees_kv: bool| {
        let mut c = Child::spawn(
            CHILD,
            &owner,
            name,
            &[
                ("push", if push { "1" } else { "0" }),
                ("kv", if sees_kv { "1" } else { "0" }),
                ("kv_addr", &kv_addr),
            ],
        )
        .expect("spawn");
        let st = c.join(WAIT).expect("the reader exits");
        assert_eq!(
            st.code(),
            Some(0),
            "{name} (push {push}, sees kv {sees_kv}): {st}"
        );
    };
    // The listed name, claimed by a process the owner never loaded: no `kv` keys.
    run(&listed, false, false);
    // Another peer, loaded (its PUSH accepted): no `kv` keys.
    run(&format!("other-{pid}"), true, false);
    // The listed peer, loaded: the `kv` keys, and its READ brings the owner's bytes.
    run(&listed, true, true);
}

#[test]
fn a_share_lists_names_and_prefixes() {
    let s = Share::new("kv", &["decode-0", "router", "decode-1*"]);
    assert!(s.lists("decode-0") && s.lists("router"));
    assert!(s.lists("decode-1") && s.lists("decode-17"));
    assert!(!s.lists("decode-2") && !s.lists("decode-00") && !s.lists("route"));
    assert!(!Share::new("kv", &[]).lists(""));
    assert!(Share::new("kv", &["*"]).lists("anyone"));
}
