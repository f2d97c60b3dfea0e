//! A throw-away single-node etcd for tests, examples and users' CI: the real `etcd` binary
//! on 127.0.0.1 (or another local address) with free ports and a temporary data directory,
//! killed on drop.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::client::{Client, ConnectOptions, EtcdError};
use super::pb;
use crate::error::{Error, Op, Result};

/// The environment variable naming the etcd binary (default: `etcd` on `PATH`).
pub const ENV_ETCD_BIN: &str = "NIXL_ETCD_BIN";

/// How long a fresh server may take to elect itself and answer `/health`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A local etcd server process.
///
/// ```
/// use nixl_core::etcd::LocalEtcd;
/// # fn main() -> nixl_core::Result<()> {
/// let etcd = match LocalEtcd::start() {
///     Ok(e) => e,
///     Err(nixl_core::Error::Unavailable { .. }) => return Ok(()), // no etcd binary here
///     Err(e) => return Err(e),
/// };
/// assert!(etcd.endpoint().starts_with("http://127.0.0.1:"));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LocalEtcd {
    child: Option<Child>,
    bin: String,
    dir: PathBuf,
    client: SocketAddr,
    peer: SocketAddr,
}

fn free_port(ip: IpAddr) -> std::io::Result<SocketAddr> {
    TcpListener::bind((ip, 0))?.local_addr()
}

fn err(what: &str, e: std::io::Error) -> Error {
    Error::io(
        "local-etcd",
        Op::Exchange,
        std::io::Error::new(e.kind(), format!("{what}: {e}")),
    )
}

/// Asks `/health` once; true when the server has a leader.
fn healthy(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
    let req = format!("GET /health HTTP/1.0\r\nHost: {}\r\n\r\n", addr.ip());
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

impl LocalEtcd {
    /// Starts a server on 127.0.0.1 (binary from [`ENV_ETCD_BIN`] or `etcd` on `PATH`) and
    /// waits until it is healthy. [`Error::Unavailable`] when there is no etcd binary.
    pub fn start() -> Result<Self> {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Like [`LocalEtcd::start`], with the client and peer ports on `ip`, an address of this
    /// machine (e.g. a host's address in a network namespace of the test kit's `netns` harness, so
    /// agents on other hosts reach it over the link). An address this machine does not have
    /// is an [`Error::Io`] (`AddrNotAvailable`), and nothing is started.
    pub fn start_on(ip: IpAddr) -> Result<Self> {
        static N: AtomicU64 = AtomicU64::new(0);
        let bin = std::env::var(ENV_ETCD_BIN).unwrap_or_else(|_| "etcd".to_owned());
        let dir = std::env::temp_dir().join(format!(
            "nixl-etcd-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let mut last = None;
        // A port picked free can be taken before etcd binds it: try fresh ports a few times.
        for _ in 0..3 {
            let _ = std::fs::remove_dir_all(&dir);
            let mut me = LocalEtcd {
                child: None,
                bin: bin.clone(),
                dir: dir.clone(),
                client: free_port(ip).map_err(|e| err("picking a port", e))?,
                peer: free_port(ip).map_err(|e| err("picking a port", e))?,
            };
            match me.spawn() {
                Ok(()) => return Ok(me),
                Err(e @ Error::Unavailable { .. }) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| err("starting etcd", std::io::ErrorKind::Other.into())))
    }

    fn spawn(&mut self) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| err("creating the data directory", e))?;
        let log = std::fs::File::create(self.dir.join("etcd.log"))
            .map_err(|e| err("creating the log", e))?;
        let log2 = log.try_clone().map_err(|e| err("creating the log", e))?;
        let (c, p) = (
            format!("http://{}", self.client),
            format!("http://{}", self.peer),
        );
        let child = Command::new(&self.bin)
            .args(["--name", "nixl-test", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--initial-cluster", &format!("nixl-test={p}")])
            // Fast elections for a one-node cluster; this also lets leases go down to 1 s.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Unavailable {
                    what: format!("the etcd binary ({})", self.bin),
                    hint: format!(
                        "install etcd-server (apt-get install etcd-server) or set {ENV_ETCD_BIN}"
                    ),
                })
            }
            Err(e) => return Err(err("spawning etcd", e)),
        };
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if healthy(self.client) {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
                let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                return Err(err(
                    "etcd exited",
                    std::io::Error::other(format!("{status}: {tail}")),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        Err(Error::TimedOut {
            agent: "local-etcd".into(),
            op: Op::Exchange,
            elapsed: START_TIMEOUT,
        })
    }

    /// The client URL, `http://IP:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.client)
    }

    /// Whether the server process is running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills the server (SIGKILL) and waits for it; the data directory stays for
    /// [`LocalEtcd::restart`].
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same ports and data (after [`LocalEtcd::kill`]).
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    /// Writes `entries` straight into etcd in one transaction, bypassing every agent and
    /// check: what any process with write access to etcd can do. For tests of hostile,
    /// stale or foreign keys. With `lease_ttl` (seconds) the keys are attached to a fresh
    /// lease that nobody keeps alive, like those of an agent that crashed right after
    /// publishing: they vanish after the TTL.
    pub fn put_raw(&self, entries: &[(&str, &[u8])], lease_ttl: Option<i64>) -> Result<()> {
        let me = "local-etcd";
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err("starting a runtime", e))?;
        let backend = |e: EtcdError| Error::Backend {
            agent: me.to_owned(),
            backend: "etcd".to_owned(),
            op: Op::Exchange,
            message: format!("raw put: {e}"),
            source: Some(std::sync::Arc::new(e)),
        };
        rt.block_on(async {
            let opts = ConnectOptions {
                connect_timeout: Duration::from_secs(5),
                keep_alive_interval: Duration::from_secs(5),
                keep_alive_timeout: Duration::from_secs(5),
            };
            let c = Client::connect(&[self.endpoint()], opts).map_err(backend)?;
            let lease = match lease_ttl {
                Some(ttl) => c.lease_grant(ttl).await.map_err(backend)?.id,
                None => 0,
            };
            let success = entries
                .iter()
                .map(|(k, v)| pb::RequestOp {
                    request: Some(pb::request_op::Request::Put(pb::PutRequest {
                        key: k.as_bytes().to_vec(),
                        value: v.to_vec(),
                        lease,
                    })),
                })
                .collect();
            c.txn(pb::TxnRequest {
                success,
                failure: Vec::new(),
            })
            .await
            .map_err(backend)?;
            Ok(())
        })
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the server: a frozen server accepts
    /// connections but never answers, like an overloaded one.
    pub fn set_paused(&mut self, paused: bool) -> Result<()> {
        let Some(c) = &self.child else {
            return Err(Error::not_allowed(
                "local-etcd",
                Op::Exchange,
                "etcd is not running",
            ));
        };
        signal(c.id(), paused).map_err(|e| err("signalling etcd", e))
    }
}

/// Sends `SIGSTOP` (`stop`) or `SIGCONT` to the server; after a stop, waits (up to 2 s) until
/// the kernel shows it stopped, so a caller that pauses the server and acts at once acts on a
/// stopped server.
fn signal(pid: u32, stop: bool) -> std::io::Result<()> {
    use rustix::process::{kill_process, Pid, Signal};
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let sig = if stop { Signal::STOP } else { Signal::CONT };
    kill_process(pid, sig)?;
    let end = Instant::now() + Duration::from_secs(2);
    while stop && Instant::now() < end {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero()))?;
        // The state follows the command name, which is in parentheses.
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        if matches!(state, Some("T" | "t" | "Z" | "X") | None) {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A frozen process still dies on SIGKILL; thaw anyway so nothing lingers.
            let _ = signal(c.id(), false);
        }
        self.kill();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::debug!(dir = %self.dir.display(), error = %e, "removing the etcd data directory failed");
        }
    }
}
