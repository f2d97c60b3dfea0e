//! OBJ (S3) backend scenarios against a real S3 server on 127.0.0.1 (moto with SigV4
//! authentication enforced), plus the shared conformance suite.
#![cfg(feature = "s3")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use nixl_backend_gds::{ObjectRegion, S3Params, S3Plugin};
use nixl_core::backend::BackendPlugin;
use nixl_core::{
    Agent, AgentConfig, Desc, Error, HostBuffer, MemKind, MemoryRegion, XferDescList, XferOp,
    XferOptions,
};
use nixl_testkit::conformance::Suite;
use nixl_testkit::s3;

/// The backend's parameters for the test server.
fn params(s: &s3::S3Server) -> S3Params {
    S3Params::default()
        .endpoint(s.endpoint.clone())
        .bucket(s.bucket.clone())
        .region(s.region.clone())
        .access_key_id(s.access_key.clone())
        .secret_access_key(s.secret_key.clone())
}

const T: Duration = Duration::from_secs(60);

macro_rules! server_or_skip {
    () => {
        match s3::server() {
            Ok(s) => s,
            Err(why) => {
                let test = std::thread::current().name().unwrap_or("s3").to_owned();
                nixl_testkit::skip(&test, nixl_testkit::Dep::S3, why);
                return;
            }
        }
    };
}

fn agent(tag: &str, params: S3Params) -> Agent {
    let a = Agent::new(
        &format!("obj-{tag}-{}", std::process::id()),
        AgentConfig::default(),
    )
    .expect("agent");
    a.create_backend(params).expect("backend");
    a
}

fn buf(len: usize) -> Arc<HostBuffer> {
    Arc::new(HostBuffer::new(len).expect("alloc"))
}

fn xfer(a: &Agent, op: XferOp, local: XferDescList, remote: XferDescList) -> nixl_core::Result<()> {
    let req = a.create_xfer_req(op, &local, &remote, a.name(), XferOptions::default())?;
    a.post_xfer_req(&req)?;
    req.wait(T)
}

#[test]
fn whole_objects_and_byte_ranges() {
    let s = server_or_skip!();
    let a = agent("ranges", params(&s));
    const BLOCK: u64 = 64 * 1024;
    let obj = Arc::new(ObjectRegion::new(s3::key("ranges"), BLOCK * 4));
    let (src, dst) = (buf(BLOCK as usize * 4), buf(BLOCK as usize * 4));
    src.fill_pattern(5);
    let _r = a
        .register_mem(vec![src.clone(), dst.clone(), obj.clone()], &[])
        .expect("register");
    xfer(
        &a,
        XferOp::Write,
        XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, 4),
        obj.blocks(0, BLOCK, 4),
    )
    .expect("write");
    // Byte ranges: blocks 2 and 0, and an odd range in the middle.
    xfer(
        &a,
        XferOp::Read,
        XferDescList::from_descs(
            MemKind::Dram,
            [
                Desc::new(dst.addr(), BLOCK),
                Desc::new(dst.addr() + BLOCK, BLOCK),
                Desc::new(dst.addr() + 2 * BLOCK, 1000),
            ],
        ),
        XferDescList::from_descs(
            MemKind::Object,
            [
                obj.desc_at(2 * BLOCK, BLOCK),
                obj.desc_at(0, BLOCK),
                obj.desc_at(12345, 1000),
            ],
        ),
    )
    .expect("read");
    let (sv, dv) = (src.to_vec(), dst.to_vec());
    let b = BLOCK as usize;
    assert_eq!(dv[..b], sv[2 * b..3 * b]);
    assert_eq!(dv[b..2 * b], sv[..b]);
    assert_eq!(dv[2 * b..2 * b + 1000], sv[12345..13345]);
    let q = a.query_mem(&[obj.desc()], &[]).expect("query");
    assert_eq!(
        q[0].map(|q| (q.exists, q.size)),
        Some((true, Some(BLOCK * 4)))
    );
}

/// The ETag the S3 server gave an object, read by a second backend on the same server.
fn etag(s: &s3::S3Server, key: &str) -> String {
    let ctx = nixl_core::backend::BackendContext {
        agent: "etag-reader".to_owned(),
        notifs: Arc::new(nixl_core::backend::NotifQueue::new()),
        peers: nixl_core::backend::PeerAuth::unauthenticated("etag-reader"),
        wake: nixl_core::backend::Wake::new(),
    };
    let b = nixl_backend_gds::S3Backend::new(params(s), ctx).expect("backend");
    b.etag(key).expect("head").expect("an ETag")
}

/// 13 MiB written as scattered blocks with a 5 MiB part size: the server stored it from a
/// three-part multipart upload (its ETag ends in `-3`), and it reads back intact as one
/// descriptor (split into ranged GETs).
#[test]
fn multipart_upload_in_three_parts_round_trips() {
    let s = server_or_skip!();
    let mut p = params(&s);
    p.part_size = 5 << 20;
    p.multipart_threshold = 5 << 20;
    p.max_concurrency = 4;
    let a = agent("multipart", p);
    // 13 MiB in 13 scattered 1 MiB blocks: three parts, the last one short.
    const MIB: u64 = 1 << 20;
    const N: usize = 13;
    let obj = Arc::new(ObjectRegion::new(s3::key("multipart"), MIB * N as u64));
    let (src, dst) = (buf(MIB as usize * N), buf(MIB as usize * N));
    src.fill_pattern(77);
    let _r = a
        .register_mem(vec![src.clone(), dst.clone(), obj.clone()], &[])
        .expect("register");
    let perm: Vec<u64> = (0..N as u64).map(|i| (i * 5) % N as u64).collect();
    let local = XferDescList::from_descs(
        MemKind::Dram,
        perm.iter().map(|&j| Desc::new(src.addr() + j * MIB, MIB)),
    );
    xfer(&a, XferOp::Write, local, obj.blocks(0, MIB, N)).expect("multipart write");
    let q = a.query_mem(&[obj.desc()], &[]).expect("query");
    assert_eq!(q[0].and_then(|q| q.size), Some(MIB * N as u64));
    let tag = etag(&s, obj.key());
    assert!(
        tag.trim_matches('"').ends_with("-3"),
        "a three-part multipart upload: ETag {tag}"
    );
    // Read it back as one descriptor: split into parallel ranged GETs.
    xfer(
        &a,
        XferOp::Read,
        XferDescList::blocks(MemKind::Dram, dst.addr(), MIB * N as u64, 1),
        obj.blocks(0, MIB * N as u64, 1),
    )
    .expect("read");
    let (sv, dv) = (src.to_vec(), dst.to_vec());
    for (i, &j) in perm.iter().enumerate() {
        let (o, k) = (i * MIB as usize, j as usize * MIB as usize);
        assert_eq!(
            dv[o..o + MIB as usize],
            sv[k..k + MIB as usize],
            "block {i}"
        );
    }
}

#[test]
fn missing_object_is_not_found() {
    let s = server_or_skip!();
    let a = agent("missing", params(&s));
    let obj = Arc::new(ObjectRegion::new(s3::key("missing"), 4096));
    let b = buf(4096);
    b.fill(3);
    let _r = a
        .register_mem(vec![b.clone(), obj.clone()], &[])
        .expect("register");
    match xfer(
        &a,
        XferOp::Read,
        XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
        obj.blocks(0, 4096, 1),
    ) {
        Err(Error::NotFound { what, .. }) => assert!(what.contains(obj.key()), "{what}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(b.to_vec().iter().all(|&x| x == 3), "buffer changed");
    let q = a.query_mem(&[obj.desc()], &[]).expect("query");
    assert_eq!(q[0].map(|q| (q.exists, q.size)), Some((false, None)));
}

#[test]
fn bad_credentials_are_not_allowed() {
    let s = server_or_skip!();
    let mut p = params(&s);
    p.secret_access_key = Some("not-the-secret".to_owned());
    let a = agent("badcreds", p);
    let obj = Arc::new(ObjectRegion::new(s3::key("badcreds"), 4096));
    let b = buf(4096);
    let _r = a
        .register_mem(vec![b.clone(), obj.clone()], &[])
        .expect("register");
    for op in [XferOp::Write, XferOp::Read] {
        match xfer(
            &a,
            op,
            XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
            obj.blocks(0, 4096, 1),
        ) {
            Err(Error::NotAllowed { reason, .. }) => {
                assert!(reason.contains("credentials"), "{reason}")
            }
            other => panic!("{op:?}: expected NotAllowed, got {other:?}"),
        }
    }
    assert!(matches!(
        a.query_mem(&[obj.desc()], &[]),
        Err(Error::NotAllowed { .. })
    ));
}

#[test]
fn unreachable_endpoint_is_unavailable() {
    // A port that was just free and is closed now: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let p = S3Params::default()
        .endpoint(format!("http://127.0.0.1:{port}"))
        .bucket("nixl-test".to_owned())
        .region("us-east-1".to_owned())
        .access_key_id("a".to_owned())
        .secret_access_key("b".to_owned())
        .max_retries(2);
    let a = agent("unreachable", p);
    let obj = Arc::new(ObjectRegion::new("some/key", 4096));
    let b = buf(4096);
    let _r = a
        .register_mem(vec![b.clone(), obj.clone()], &[])
        .expect("register");
    for op in [XferOp::Write, XferOp::Read] {
        match xfer(
            &a,
            op,
            XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
            obj.blocks(0, 4096, 1),
        ) {
            Err(Error::Unavailable { what, .. }) => {
                assert!(what.contains(&port.to_string()), "{what}")
            }
            other => panic!("{op:?}: expected Unavailable, got {other:?}"),
        }
    }
    assert!(matches!(
        a.query_mem(&[obj.desc()], &[]),
        Err(Error::Unavailable { .. })
    ));
}

#[test]
fn partial_object_writes_and_bad_params_are_refused() {
    let a = agent(
        "partial",
        S3Params::default()
            .endpoint("http://127.0.0.1:9".to_owned())
            .bucket("b".to_owned())
            .region("us-east-1".to_owned()),
    );
    let obj = Arc::new(ObjectRegion::new(s3::key("partial"), 8192));
    let b = buf(8192);
    let _r = a
        .register_mem(vec![b.clone(), obj.clone()], &[])
        .expect("register");
    // A WRITE must cover the object from offset 0 without gaps.
    let r = a.create_xfer_req(
        XferOp::Write,
        &XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
        &obj.blocks(4096, 4096, 1),
        a.name(),
        XferOptions::default(),
    );
    assert!(matches!(r, Err(Error::InvalidParam { .. })), "{r:?}");
    // An empty key is refused at registration.
    assert!(matches!(
        a.register_mem(vec![Arc::new(ObjectRegion::new("", 10))], &[]),
        Err(Error::InvalidParam { .. })
    ));
    // Parameters.
    let bad = Agent::new(
        &format!("obj-badparams-{}", std::process::id()),
        AgentConfig::default(),
    )
    .expect("agent");
    assert!(matches!(
        bad.create_backend(S3Params::default().part_size(1024)),
        Err(Error::InvalidParam { .. })
    ));
    assert!(bad.backends().is_empty());
    let mut m = BTreeMap::new();
    m.insert("part_size".to_owned(), "lots".to_owned());
    assert!(matches!(
        S3Plugin.parse_params(&m),
        Err(Error::InvalidParam { .. })
    ));
    m.clear();
    m.insert("nope".to_owned(), "1".to_owned());
    assert!(matches!(
        S3Plugin.parse_params(&m),
        Err(Error::InvalidParam { .. })
    ));
    assert!(S3Plugin.parse_params(&S3Plugin.default_params()).is_ok());
}

fn s3_suite() -> Option<Suite> {
    let s = match s3::server() {
        Ok(s) => s,
        Err(why) => {
            let test = std::thread::current().name().unwrap_or("s3").to_owned();
            nixl_testkit::skip(&test, nixl_testkit::Dep::S3, why);
            return None;
        }
    };
    let p = params(&s);
    Some(Suite {
        name: "obj".to_owned(),
        config: AgentConfig::default(),
        create: Arc::new(move |a: &Agent| a.create_backend(p.clone())),
        storage: Some(Arc::new(|len| {
            Ok(Arc::new(ObjectRegion::new(s3::key("conf"), len)) as Arc<dyn MemoryRegion>)
        })),
    })
}

/// The shared conformance suite on S3 (moto), one test per case.
mod conformance_s3 {
    nixl_testkit::conformance_tests!(super::s3_suite);
}

/// Stopping a multipart upload never leaves its parts on the server (issue 28): a 64 MiB WRITE
/// (13 parts of 5 MiB, one at a time) is canceled, dropped, or ended by its deadline while
/// its parts go up; each time the server is left with no multipart upload in progress (before:
/// the task was aborted mid-upload and the upload with its parts stayed, billed, forever).
#[test]
fn a_stopped_multipart_upload_leaves_no_parts_behind() {
    let s = server_or_skip!();
    let mut p = params(&s);
    p.part_size = 5 << 20;
    p.multipart_threshold = 5 << 20;
    p.max_concurrency = 1;
    let a = agent("stopped-multipart", p);
    const LEN: u64 = 64 << 20;
    let src = buf(LEN as usize);
    src.fill_pattern(3);
    let before = s3::multipart_uploads(&s.bucket);
    for how in ["cancel", "drop", "deadline"] {
        let obj = Arc::new(ObjectRegion::new(s3::key(how), LEN));
        let _r = a
            .register_mem(vec![src.clone(), obj.clone()], &[])
            .expect("register");
        let opts =
            XferOptions::default().timeout((how == "deadline").then(|| Duration::from_millis(300)));
        let req = a
            .create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, src.addr(), LEN, 1),
                &obj.blocks(0, LEN, 1),
                a.name(),
                opts,
            )
            .expect("make");
        a.post_xfer_req(&req).expect("post");
        // Let the upload start and a part or two go up.
        std::thread::sleep(Duration::from_millis(200));
        match how {
            "cancel" => req.cancel().expect("cancel"),
            "drop" => drop(req),
            _ => {
                let e = req.wait(T).expect_err("past its deadline");
                assert!(matches!(e, Error::TimedOut { .. }), "{e}");
                // The request drains until the task has aborted the upload.
                let end = std::time::Instant::now() + T;
                while req.is_draining() && std::time::Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(10));
                }
                assert!(!req.is_draining());
            }
        }
        // Dropping hands the stop to the agent: give the task its moment.
        let end = std::time::Instant::now() + T;
        while s3::multipart_uploads(&s.bucket) != before && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            s3::multipart_uploads(&s.bucket),
            before,
            "{how}: a multipart upload stayed on the server"
        );
    }
}

/// A server that answers every request with 500, and one that accepts and never answers: a
/// WRITE and a READ end typed by their deadline (never hang), with nothing left running.
#[test]
fn a_failing_or_silent_server_ends_requests_by_their_deadline() {
    use std::io::{Read, Write};
    for mode in ["500", "silent"] {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (m, st) = (mode, stop.clone());
        l.set_nonblocking(true).expect("nonblocking");
        let server = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !st.load(std::sync::atomic::Ordering::Acquire) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        if m == "500" {
                            let mut b = [0u8; 65536];
                            c.set_read_timeout(Some(Duration::from_millis(200))).ok();
                            let _ = c.read(&mut b);
                            let _ = c.write_all(
                                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n",
                            );
                        }
                        held.push(c);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        let p = S3Params::default()
            .endpoint(format!("http://127.0.0.1:{port}"))
            .bucket("nixl-test".to_owned())
            .region("us-east-1".to_owned())
            .access_key_id("a".to_owned())
            .secret_access_key("b".to_owned());
        let a = agent(&format!("server-{mode}"), p);
        let obj = Arc::new(ObjectRegion::new("some/key", 4096));
        let b = buf(4096);
        let _r = a
            .register_mem(vec![b.clone(), obj.clone()], &[])
            .expect("register");
        for op in [XferOp::Write, XferOp::Read] {
            let t = std::time::Instant::now();
            let req = a
                .create_xfer_req(
                    op,
                    &XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
                    &obj.blocks(0, 4096, 1),
                    a.name(),
                    XferOptions::default().timeout(Duration::from_secs(2)),
                )
                .expect("make");
            a.post_xfer_req(&req).expect("post");
            let e = req.wait(T).expect_err("no answer can complete it");
            let took = t.elapsed();
            println!("{mode} {op:?}: {e} after {took:?}");
            assert!(
                took < Duration::from_secs(2) + Duration::from_secs(3),
                "{took:?}"
            );
            assert!(
                matches!(e.kind().as_str(), "timed_out" | "backend" | "unavailable"),
                "{e}"
            );
            let end = std::time::Instant::now() + T;
            while req.is_draining() && std::time::Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(!req.is_draining(), "{mode} {op:?}: the task never stopped");
            // Queued and in-flight work stops with the deadline (before: the request drained
            // until object_store's own retries and timeouts gave up, a minute later).
            let drained = t.elapsed();
            assert!(
                drained < Duration::from_secs(2) + Duration::from_secs(3),
                "{mode} {op:?}: still running {drained:?} after its post"
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
        server.join().expect("server");
    }
}

/// Done means landed for objects too (issue 33): a server that sends the headers of a READ's
/// answer and part of its body, then dies (closes the connection), never ends the READ `Done`:
/// it fails typed and the request is quiescent. The same server sending the whole body is the
/// control: that READ lands every byte.
#[test]
fn a_server_dying_mid_read_never_ends_it_done() {
    use std::io::{Read, Write};
    const LEN: usize = 1 << 20;
    let body: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 | 1).collect();
    for whole in [true, false] {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let data = body.clone();
        let server = std::thread::spawn(move || {
            // Answers every request (a retry included) the same way, until the test ends.
            l.set_nonblocking(false).ok();
            for c in l.incoming().take(8) {
                let Ok(mut c) = c else { break };
                let mut req = Vec::new();
                let mut b = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&b[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\ncontent-length: {LEN}\r\n\
                     content-range: bytes 0-{}/{LEN}\r\netag: \"e\"\r\n\
                     last-modified: Sun, 29 Nov 2026 08:00:00 GMT\r\n\r\n",
                    LEN - 1
                );
                let _ = c.write_all(head.as_bytes());
                let n = if whole { LEN } else { LEN / 4 };
                let _ = c.write_all(&data[..n]);
                // Dies: the connection closes with the body incomplete.
            }
        });
        let p = S3Params::default()
            .endpoint(format!("http://127.0.0.1:{port}"))
            .bucket("nixl-test".to_owned())
            .region("us-east-1".to_owned())
            .access_key_id("a".to_owned())
            .secret_access_key("b".to_owned());
        let a = agent(&format!("dies-{whole}"), p);
        let obj = Arc::new(ObjectRegion::new("some/key", LEN as u64));
        let b = buf(LEN);
        let _r = a
            .register_mem(vec![b.clone(), obj.clone()], &[])
            .expect("register");
        let req = a
            .create_xfer_req(
                XferOp::Read,
                &XferDescList::blocks(MemKind::Dram, b.addr(), LEN as u64, 1),
                &obj.blocks(0, LEN as u64, 1),
                a.name(),
                XferOptions::default().timeout(Duration::from_secs(10)),
            )
            .expect("make");
        a.post_xfer_req(&req).expect("post");
        let r = req.wait(T);
        println!("whole body {whole}: {r:?}");
        if whole {
            r.expect("the control READ");
            assert!(b.to_vec() == body, "the control landed every byte");
        } else {
            let e = r.expect_err("a READ whose body was cut cannot be Done");
            assert!(
                matches!(
                    e.kind().as_str(),
                    "backend" | "io" | "unavailable" | "timed_out"
                ),
                "{e}"
            );
            assert!(req.wait_quiescent(T).is_ok(), "quiescent after the error");
        }
        drop(req);
        drop(a);
        drop(server);
    }
}
