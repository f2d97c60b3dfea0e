//! Metadata through a c10d TCPStore: nixl-rs's server and client against each other and
//! against hostile bytes, and (where torch imports: the GPU machines) against PyTorch's own
//! `TCPStore`, server and client. NIXL 1.5.1 agents over a store: `nixl-backend-ucx`'s
//! `nixl_interop` test `metadata_by_tcpstore_both_ways`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nixl_core::tcpstore::wire::{QueryType, Request, VALIDATION_MAGIC, WAIT_CANCELED, WAIT_STOP};
use nixl_core::tcpstore::{
    TcpStoreClient, TcpStoreConfig, TcpStoreExchange, TcpStoreServer, TcpStoreServerConfig,
};
use nixl_core::{Agent, Error, MemKind, XferDescList, XferOp, XferOptions};
use nixl_testkit::torch_store::TorchStore;
use nixl_testkit::{inproc_agent, pattern, registered, snapshot};

const OP: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(15);
const LEN: usize = 64 << 10;

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn server() -> TcpStoreServer {
    TcpStoreServer::start(loopback(), &TcpStoreServerConfig::default()).expect("server")
}

fn client(endpoint: &str) -> TcpStoreClient {
    TcpStoreClient::connect(endpoint, "test", OP).expect("client")
}

/// A raw connection that has sent `VALIDATE`.
fn raw(s: &TcpStoreServer) -> TcpStream {
    let mut c = TcpStream::connect(s.local_addr()).expect("connect");
    c.set_read_timeout(Some(WAIT)).expect("timeout");
    c.write_all(
        &Request::new(QueryType::Validate)
            .u32(VALIDATION_MAGIC)
            .into_vec(),
    )
    .expect("validate");
    c
}

/// Whether the server closed `c` (a read returns 0 or an error within `within`).
fn closed(c: &mut TcpStream, within: Duration) -> bool {
    c.set_read_timeout(Some(within)).expect("timeout");
    let mut b = [0u8; 1];
    !matches!(c.read(&mut b), Ok(n) if n > 0)
        && !matches!(c.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Polls `f` until it holds or `WAIT` passes; whether it held.
fn eventually(f: impl FnMut() -> bool) -> bool {
    nixl_testkit::eventually(WAIT, f)
}

/// The client's operations against a store at `endpoint`.
fn client_ops(endpoint: &str) {
    let mut c = client(endpoint);
    let key = nixl_testkit::unique("k");
    assert_eq!(c.get(&key).expect("get"), None);
    assert!(!c.check(&[&key]).expect("check"));
    c.set(&key, b"v1").expect("set");
    assert_eq!(c.get(&key).expect("get"), Some(b"v1".to_vec()));
    c.set(&key, b"").expect("an empty value");
    assert_eq!(
        c.get(&key).expect("get"),
        Some(Vec::new()),
        "set, though empty"
    );
    let n = nixl_testkit::unique("n");
    assert_eq!(c.add(&n, 5).expect("add"), 5);
    assert_eq!(c.add(&n, -2).expect("add"), 3);
    assert_eq!(
        c.multi_get(&[&key, &n, "absent"]).expect("multi_get"),
        vec![Vec::new(), b"3".to_vec(), Vec::new()]
    );
    assert!(c.num_keys().expect("num_keys") >= 2);
    assert!(c.delete(&key).expect("delete"));
    assert!(!c.delete(&key).expect("delete again"));
    assert_eq!(c.get(&key).expect("get"), None);
}

#[test]
fn the_client_against_the_server() {
    let s = server();
    client_ops(&s.endpoint());
    // Keys carry c10d's '/': what a torch client calls "k" is "/k" on the wire.
    let mut c = client(&s.endpoint());
    c.set("plain", b"x").expect("set");
    let mut r = raw(&s);
    r.write_all(&Request::new(QueryType::Get).bytes(b"/plain").into_vec())
        .expect("get");
    let mut got = [0u8; 9];
    r.read_exact(&mut got).expect("answer");
    assert_eq!(&got, b"\x01\0\0\0\0\0\0\0x");
}

#[test]
fn bad_client_calls_are_typed_and_send_nothing() {
    let s = server();
    let mut c = client(&s.endpoint()).max_value(16);
    assert!(matches!(
        c.set("k", &[0u8; 17]),
        Err(Error::LimitExceeded { .. })
    ));
    assert!(matches!(
        c.set(&"k".repeat(8 * 1024), b"v"),
        Err(Error::LimitExceeded { .. })
    ));
    assert!(s.is_empty(), "nothing reached the store");
    for bad in ["", "no-port", "127.0.0.1:notaport"] {
        assert!(
            matches!(
                TcpStoreClient::connect(bad, "t", OP),
                Err(Error::InvalidParam { .. })
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        TcpStoreClient::connect(&s.endpoint(), "t", Duration::ZERO),
        Err(Error::InvalidParam { .. })
    ));
    // Nobody listens: a typed I/O error at once.
    let dead = TcpListener::bind(loopback()).expect("bind");
    let addr = dead.local_addr().expect("addr").to_string();
    drop(dead);
    assert!(matches!(
        TcpStoreClient::connect(&addr, "t", OP),
        Err(Error::Io { .. })
    ));
}

#[test]
fn the_server_refuses_what_breaks_the_protocol_and_changes_nothing() {
    let cfg = TcpStoreServerConfig::default()
        .frame_timeout(Duration::from_millis(300))
        .max_bytes(4096)
        .max_value(1024);
    let s = TcpStoreServer::start(loopback(), &cfg).expect("server");
    let set = |k: &[u8], v: &[u8]| Request::new(QueryType::Set).bytes(k).bytes(v).into_vec();
    // A first query that is not VALIDATE.
    let mut c = TcpStream::connect(s.local_addr()).expect("connect");
    c.write_all(&set(b"/a", b"1")).expect("write");
    assert!(closed(&mut c, WAIT));
    // VALIDATE with another number.
    let mut c = TcpStream::connect(s.local_addr()).expect("connect");
    c.write_all(&Request::new(QueryType::Validate).u32(7).into_vec())
        .expect("write");
    c.write_all(&set(b"/a", b"1")).expect("write");
    assert!(closed(&mut c, WAIT));
    // A value over the limit, a claimed length of 2^60, a query type c10d lacks here.
    for q in [
        set(b"/a", &[0u8; 1025]),
        Request::new(QueryType::Set)
            .bytes(b"/a")
            .u64(1 << 60)
            .into_vec(),
        vec![99u8],
    ] {
        let mut c = raw(&s);
        c.write_all(&q).expect("write");
        assert!(closed(&mut c, WAIT));
    }
    // The store full: the SET that would pass max_bytes closes its connection.
    let mut c = raw(&s);
    c.write_all(&set(b"/big", &[1u8; 1000])).expect("write");
    c.write_all(&set(b"/big2", &[1u8; 1000])).expect("write");
    c.write_all(&set(b"/big3", &[1u8; 1000])).expect("write");
    c.write_all(&set(b"/big4", &[1u8; 1000])).expect("write");
    c.write_all(&set(b"/big5", &[1u8; 1000])).expect("write");
    assert!(closed(&mut c, WAIT));
    assert_eq!(s.len(), 4, "the four that fit, not the fifth");
    // A query trickled byte by byte is cut off at the frame timeout.
    let mut c = raw(&s);
    let t = Instant::now();
    let q = set(b"/slow", b"1");
    c.write_all(&q[..3]).expect("write");
    assert!(closed(&mut c, WAIT));
    assert!(
        t.elapsed() < Duration::from_millis(300) + Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(s.len(), 4, "nothing of the refused queries was stored");
    // The server still serves.
    client_ops(&s.endpoint());
}

#[test]
fn connections_over_the_limit_are_closed_and_the_rest_served() {
    let s = TcpStoreServer::start(
        loopback(),
        &TcpStoreServerConfig::default().max_connections(2),
    )
    .expect("server");
    let (_a, _b) = (raw(&s), raw(&s));
    assert!(eventually(|| s.connections() == 2));
    let mut c = raw(&s);
    assert!(closed(&mut c, WAIT), "the third connection is closed");
    drop(_a);
    assert!(eventually(|| s.connections() == 1));
    client_ops(&s.endpoint());
}

#[test]
fn wait_answers_when_every_key_is_set_and_cancel_ends_it() {
    let s = server();
    let wait = |k: &[u8]| Request::new(QueryType::Wait).u64(1).bytes(k).into_vec();
    let mut w = raw(&s);
    w.write_all(&wait(b"/later")).expect("wait");
    std::thread::sleep(Duration::from_millis(100));
    client(&s.endpoint()).set("later", b"x").expect("set");
    let mut b = [9u8; 1];
    w.read_exact(&mut b).expect("answer");
    assert_eq!(b[0], WAIT_STOP);
    w.write_all(&wait(b"/never")).expect("wait");
    std::thread::sleep(Duration::from_millis(50));
    w.write_all(&Request::new(QueryType::CancelWait).into_vec())
        .expect("cancel");
    w.read_exact(&mut b).expect("answer");
    assert_eq!(b[0], WAIT_CANCELED);
    // The connection serves on.
    w.write_all(&Request::new(QueryType::Ping).u32(42).into_vec())
        .expect("ping");
    let mut n = [0u8; 4];
    w.read_exact(&mut n).expect("pong");
    assert_eq!(u32::from_le_bytes(n), 42);
}

/// A server that answers whatever `reply` says to each connection (after reading a bit).
fn hostile(reply: impl Fn(usize) -> Vec<u8> + Send + 'static) -> String {
    let l = TcpListener::bind(loopback()).expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for (i, s) in l.incoming().take(8).enumerate() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            let _ = s.write_all(&reply(i));
            std::thread::sleep(Duration::from_secs(3));
        }
    });
    addr
}

#[test]
fn hostile_servers_give_typed_errors_within_the_deadline() {
    let op = Duration::from_millis(400);
    // Silent: the handshake times out.
    let silent = hostile(|_| Vec::new());
    let t = Instant::now();
    assert!(matches!(
        TcpStoreClient::connect(&silent, "t", op),
        Err(Error::TimedOut { .. })
    ));
    assert!(
        t.elapsed() < op + Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
    // Not c10d: a wrong PING answer.
    let liar = hostile(|_| vec![1, 2, 3, 4]);
    assert!(matches!(
        TcpStoreClient::connect(&liar, "t", op),
        Err(Error::Decode { .. })
    ));
    // A value of 2^60 bytes claimed: refused before allocation. The first connection answers
    // the handshake (the nonce echoed is checked, so the fake reads and echoes it).
    let l = TcpListener::bind(loopback()).expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let mut hello = [0u8; 10];
        if s.read_exact(&mut hello).is_err() {
            return;
        }
        let _ = s.write_all(&hello[6..10]);
        // CHECK -> READY, then GET -> a huge length.
        let mut q = [0u8; 64];
        let _ = s.read(&mut q);
        let _ = s.write_all(&[0]);
        let _ = s.read(&mut q);
        let _ = s.write_all(&(1u64 << 60).to_le_bytes());
        std::thread::sleep(Duration::from_secs(3));
    });
    let mut c = TcpStoreClient::connect(&addr, "t", op).expect("handshake");
    assert!(matches!(
        c.get("k"),
        Err(Error::Decode {
            source: nixl_core::backend::DecodeError::TooLarge { .. },
            ..
        })
    ));
}

/// An agent with a registered, patterned buffer.
struct Peer {
    agent: Agent,
    buf: std::sync::Arc<nixl_core::HostBuffer>,
    _reg: nixl_core::Registration,
}

fn peer(prefix: &str, seed: u64) -> Peer {
    peer_as(inproc_agent(prefix), seed)
}

/// A peer made of `agent`.
fn peer_as(agent: Agent, seed: u64) -> Peer {
    let (buf, reg) = registered(&agent, LEN);
    assert!(buf.write_at(0, &pattern(seed, LEN)));
    Peer {
        agent,
        buf,
        _reg: reg,
    }
}

/// `a` READs `b`'s buffer and checks every byte.
fn read_all(a: &Peer, b: &Peer, seed: u64) {
    let req = a
        .agent
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, a.buf.addr(), LEN as u64, 1),
            &XferDescList::blocks(MemKind::Dram, b.buf.addr(), LEN as u64, 1),
            b.agent.name(),
            XferOptions::default(),
        )
        .expect("request");
    a.agent.post_xfer_req(&req).expect("post");
    req.wait(WAIT).expect("done");
    assert!(a.buf.to_vec() == pattern(seed, LEN), "every byte landed");
}

fn config(endpoint: &str) -> TcpStoreConfig {
    TcpStoreConfig::default()
        .endpoint(endpoint)
        .watch_interval(Some(Duration::from_millis(100)))
}

/// Two agents find each other through the store at `endpoint`, move bytes, and see each
/// other's invalidation and restart.
fn exchange_round(endpoint: &str) {
    let (a, b) = (peer("a", 1), peer("b", 2));
    let (xa, xb) = (
        TcpStoreExchange::new(&a.agent, &config(endpoint)).expect("a"),
        TcpStoreExchange::new(&b.agent, &config(endpoint)).expect("b"),
    );
    // A fetch waits for a publication that comes later.
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        xb.publish().expect("publish");
        xb
    });
    assert_eq!(
        xa.fetch(b.agent.name(), WAIT).expect("fetch"),
        b.agent.name()
    );
    let xb = t.join().expect("publisher");
    assert_eq!(xa.watched_peers(), vec![b.agent.name().to_owned()]);
    read_all(&a, &b, 2);
    // b invalidates itself: a's watch sees the key gone.
    xb.invalidate_local().expect("invalidate");
    assert!(
        eventually(|| !a.agent.check_remote_metadata(b.agent.name(), None)),
        "a never invalidated b"
    );
    assert!(matches!(
        xa.fetch(b.agent.name(), Duration::ZERO),
        Err(Error::NotFound { .. })
    ));
    // b restarts under its name: a loads the new incarnation by itself.
    xb.publish().expect("publish");
    xa.fetch(b.agent.name(), WAIT).expect("fetch");
    let g1 = b.agent.generation();
    let again = Agent::new(b.agent.name(), nixl_core::AgentConfig::default()).expect("agent");
    again
        .create_backend(nixl_core::InprocParams::default())
        .expect("backend");
    let b2 = peer_as(again, 3);
    let xb2 = TcpStoreExchange::new(&b2.agent, &config(endpoint)).expect("b2");
    xb2.publish().expect("publish");
    assert!(eventually(
        || a.agent.remote_generation(b.agent.name()) == Some(b2.agent.generation())
    ));
    assert_ne!(g1, b2.agent.generation());
    read_all(&a, &b2, 3);
}

#[test]
fn two_agents_through_the_server() {
    let s = server();
    exchange_round(&s.endpoint());
}

#[test]
fn bad_exchange_calls_and_bad_values_change_nothing() {
    let s = server();
    let (a, b) = (peer("a", 1), peer("b", 2));
    let xa = TcpStoreExchange::new(&a.agent, &config(&s.endpoint())).expect("a");
    let before = snapshot(&a.agent);
    // Not published within the wait: NotFound, after about the wait.
    let t = Instant::now();
    assert!(matches!(
        xa.fetch(b.agent.name(), Duration::from_millis(200)),
        Err(Error::NotFound { .. })
    ));
    assert!(t.elapsed() >= Duration::from_millis(200) && t.elapsed() < Duration::from_secs(3));
    assert!(matches!(
        xa.fetch("", WAIT),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        xa.fetch(a.agent.name(), WAIT),
        Err(Error::NotAllowed { .. })
    ));
    assert!(matches!(
        xa.fetch_label(b.agent.name(), "", WAIT),
        Err(Error::InvalidParam { .. })
    ));
    // Garbage, and another agent's metadata, under b's key.
    let key = xa.key(b.agent.name(), "metadata");
    let mut c = client(&s.endpoint());
    c.set(&key, b"not metadata").expect("set");
    assert!(matches!(
        xa.fetch(b.agent.name(), WAIT),
        Err(Error::Decode { .. })
    ));
    let other = peer("c", 4);
    c.set(&key, &other.agent.local_metadata().expect("md"))
        .expect("set");
    assert!(matches!(
        xa.fetch(b.agent.name(), WAIT),
        Err(Error::Mismatch { .. })
    ));
    // Publishing another agent's metadata as ours.
    assert!(matches!(
        xa.publish_bytes("metadata", &other.agent.local_metadata().expect("md")),
        Err(Error::Mismatch { .. })
    ));
    assert_eq!(
        c.get(&xa.key(a.agent.name(), "metadata")).expect("get"),
        None
    );
    assert_eq!(snapshot(&a.agent), before, "nothing loaded or changed");
    // No endpoint anywhere.
    let none = TcpStoreConfig::default();
    if std::env::var_os(nixl_core::tcpstore::ENV_ENDPOINT).is_none() {
        assert!(matches!(
            TcpStoreExchange::new(&a.agent, &none),
            Err(Error::InvalidParam { .. })
        ));
    }
}

#[test]
fn torch_hosts_the_store() {
    let test = "torch_hosts_the_store";
    let Some(mut torch) = TorchStore::serve(test) else {
        return;
    };
    let ep = torch.endpoint();
    client_ops(&ep);
    // What one side writes, the other reads, under the same keys.
    let mut c = client(&ep);
    c.set("from-rs", b"\x00\xffrs").expect("set");
    assert_eq!(torch.get("from-rs"), Some(b"\x00\xffrs".to_vec()));
    torch.set("from-torch", b"torch\x00");
    assert_eq!(
        c.get("from-torch").expect("get"),
        Some(b"torch\x00".to_vec())
    );
    assert_eq!(torch.add("count", 2), 2);
    assert_eq!(c.add("count", 3).expect("add"), 5);
    assert!(c.delete("from-torch").expect("delete"));
    assert!(!torch.check(&["from-torch"]));
    exchange_round(&ep);
}

#[test]
fn torch_joins_our_server() {
    let test = "torch_joins_our_server";
    let s = server();
    let Some(mut torch) = TorchStore::join(test, s.local_addr()) else {
        return;
    };
    let mut c = client(&s.endpoint());
    torch.set("from-torch", b"abc");
    assert_eq!(c.get("from-torch").expect("get"), Some(b"abc".to_vec()));
    c.set("from-rs", b"xyz").expect("set");
    assert_eq!(torch.get("from-rs"), Some(b"xyz".to_vec()));
    assert_eq!(torch.add("n", 4), 4);
    assert_eq!(c.add("n", 1).expect("add"), 5);
    assert!(torch.delete("from-rs"));
    assert_eq!(c.get("from-rs").expect("get"), None);
    assert_eq!(torch.num_keys(), c.num_keys().expect("num_keys"));
}

#[test]
fn a_store_that_dies_gives_typed_errors_and_a_restarted_one_serves_again() {
    let s = server();
    let addr = s.local_addr();
    let (a, b) = (peer("a", 1), peer("b", 2));
    let cfg = config(&s.endpoint()).op_timeout(Duration::from_secs(2));
    let (xa, xb) = (
        TcpStoreExchange::new(&a.agent, &cfg).expect("a"),
        TcpStoreExchange::new(&b.agent, &cfg).expect("b"),
    );
    xb.publish().expect("publish");
    xa.fetch(b.agent.name(), WAIT).expect("fetch");
    drop(s);
    // Every call fails typed within its deadline; nothing loaded is dropped for it.
    let t = Instant::now();
    let e = xb.publish().expect_err("the store is gone");
    assert!(
        matches!(e, Error::Io { .. } | Error::TimedOut { .. }),
        "{e}"
    );
    let e = xa
        .fetch(b.agent.name(), Duration::from_millis(100))
        .expect_err("the store is gone");
    assert!(
        matches!(e, Error::Io { .. } | Error::TimedOut { .. }),
        "{e}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(2) * 2 + Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
    std::thread::sleep(Duration::from_millis(300)); // a few watch passes fail
    assert!(
        a.agent.check_remote_metadata(b.agent.name(), None),
        "a store that does not answer invalidates nobody"
    );
    // The store comes back on its address (empty): the clients connect again.
    let s2 = TcpStoreServer::start(addr, &TcpStoreServerConfig::default()).expect("restart");
    xb.publish().expect("publish again");
    assert_eq!(s2.len(), 1);
    xa.fetch(b.agent.name(), WAIT).expect("fetch again");
    read_all(&a, &b, 2);
}
