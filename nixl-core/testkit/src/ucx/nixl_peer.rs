//! A stock NIXL agent (the nixl-cu13 wheel's Python API, `nixl-core/testkit/py/nixl_peer.py`) in a child
//! process, driven by JSON lines, and the nixl-rs side's set-up for talking to it.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::py_child::PyChild;
pub use crate::{hex, unhex};

/// Where the wheel is: `NIXL_PYTHONPATH` and `NIXL_WHEEL_UCX`, printed by
/// `scripts/deps/nixl.sh`.
#[derive(Debug, Clone)]
pub struct NixlEnv {
    /// `PYTHONPATH` holding `nixl_cu13`.
    pub pythonpath: String,
    /// The wheel's `libucp`.
    pub ucx: PathBuf,
    /// `nixl-cu13`'s version.
    pub version: String,
}

/// The wheel, or a skip (`Dep::Nixl`) saying why not.
pub fn nixl_or_skip(test: &str) -> Option<NixlEnv> {
    let skip = |why: String| {
        crate::skip(test, crate::Dep::Nixl, why);
        None
    };
    let (Ok(pythonpath), Ok(ucx)) = (
        std::env::var("NIXL_PYTHONPATH"),
        std::env::var("NIXL_WHEEL_UCX"),
    ) else {
        return skip("NIXL_PYTHONPATH / NIXL_WHEEL_UCX not set (run scripts/deps/nixl.sh)".into());
    };
    let out = Command::new("python3")
        .args(["-c", "from importlib.metadata import version; import nixl_cu13._api; print(version('nixl-cu13'))"])
        .env("PYTHONPATH", &pythonpath)
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let version = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            println!("{test}: interop against NIXL {version} (nixl-cu13) with its UCX {ucx}");
            if std::env::var_os("UCX_MODULES").is_none() {
                run_in_child(test);
                return None;
            }
            Some(NixlEnv {
                pythonpath,
                ucx: PathBuf::from(ucx),
                version,
            })
        }
        Ok(o) => skip(format!(
            "nixl_cu13 does not import: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => skip(format!("python3: {e}")),
    }
}

/// UCX modules the test processes load: the wheel's `ib` and `rdmacm` modules pull in its
/// bundled libnl, which crashes in its exit handlers (NIXL's own processes too), so a test
/// process that loaded them dies with SIGSEGV after its tests passed.
pub const UCX_MODULES: &str = "^ib,rdmacm";

/// Runs `test` alone in a child of this test binary with [`UCX_MODULES`] set, and fails
/// unless it passed there.
fn run_in_child(test: &str) {
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env("UCX_MODULES", UCX_MODULES)
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} failed in its child process ({})",
        out.status
    );
}

/// A NIXL agent in a child process.
#[derive(Debug)]
pub struct NixlPeer {
    /// Its agent name.
    pub name: String,
    py: PyChild,
}

impl NixlPeer {
    /// Starts `nixl-core/testkit/py/nixl_peer.py` with `UCX_TLS=tls` and creates agent `name` in it.
    pub fn start(env: &NixlEnv, name: &str, tls: &str, extra: &[(&str, &str)]) -> Self {
        let mut p = Self::start_bare(env, tls, extra);
        p.name = name.to_owned();
        p.ok(json!({"op": "init", "name": name}));
        p
    }

    /// Like [`NixlPeer::start`] with NIXL's listener thread on a free port of 127.0.0.1;
    /// returns the peer and its port. A port another test took between the probe and NIXL's
    /// bind ("Failed to bind metadata listener socket") is retried with a new one.
    pub fn start_listening(env: &NixlEnv, name: &str, tls: &str) -> (Self, u16) {
        let mut last = String::new();
        for _ in 0..8 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free port");
            let mut p = Self::start_bare(env, tls, &[]);
            p.name = name.to_owned();
            match p.call(json!({"op": "init", "name": name, "listen": true, "port": port})) {
                Ok(_) => return (p, port),
                Err(e) if e.contains("bind") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("NIXL's listener found no free port in 8 tries: {last}")
    }

    /// Starts the script without creating an agent (send `init` yourself).
    pub fn start_bare(env: &NixlEnv, tls: &str, extra: &[(&str, &str)]) -> Self {
        // NIXL_PEER_SCRIPT: where the script is when the binary runs on another machine.
        let script = std::env::var("NIXL_PEER_SCRIPT")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/py/nixl_peer.py").to_owned());
        let mut cmd = Command::new("python3");
        cmd.arg(script)
            .env("PYTHONPATH", &env.pythonpath)
            .env("UCX_TLS", tls)
            .env("UCX_KEEPALIVE_INTERVAL", "500ms");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        NixlPeer {
            name: String::new(),
            py: PyChild::spawn(cmd, "nixl").expect("python3 starts"),
        }
    }

    /// Sends a command; the answer, or the error the script reported.
    pub fn call(&mut self, cmd: Value) -> Result<Value, String> {
        self.py.call(cmd)
    }

    /// Sends a command that must succeed.
    #[track_caller]
    pub fn ok(&mut self, cmd: Value) -> Value {
        self.py.ok(cmd)
    }

    /// Registers a DRAM buffer (pattern `seed`, or zeros) and returns its address.
    pub fn alloc(&mut self, len: usize, seed: Option<u64>) -> u64 {
        let mut c = json!({"op": "alloc", "len": len});
        if let Some(s) = seed {
            c["seed"] = json!(s);
        }
        self.ok(c)["addr"].as_u64().expect("addr")
    }

    /// The agent's metadata blob.
    pub fn metadata(&mut self) -> Vec<u8> {
        unhex(self.ok(json!({"op": "md"}))["md"].as_str().expect("md"))
    }

    /// Loads a blob; returns the name NIXL reports.
    pub fn load(&mut self, md: &[u8]) -> Result<String, String> {
        self.call(json!({"op": "load", "md": hex(md)}))
            .map(|v| v["name"].as_str().unwrap_or_default().to_owned())
    }

    /// The bytes of its memory.
    pub fn read(&mut self, addr: u64, len: usize) -> Vec<u8> {
        unhex(
            self.ok(json!({"op": "read", "addr": addr, "len": len}))["hex"]
                .as_str()
                .expect("hex"),
        )
    }

    /// A transfer posted and polled to its end by NIXL; returns NIXL's final state.
    pub fn xfer(
        &mut self,
        kind: &str,
        laddr: u64,
        raddr: u64,
        len: usize,
        remote: &str,
        notif: &[u8],
    ) -> String {
        self.ok(
            json!({"op": "xfer", "kind": kind, "laddr": laddr, "raddr": raddr, "len": len,
            "remote": remote, "notif": hex(notif)}),
        )["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Waits up to `wait` for `count` notifications; returns (sender, message) pairs.
    pub fn notifs(&mut self, count: usize, wait: Duration) -> Vec<(String, Vec<u8>)> {
        let v = self.ok(json!({"op": "notifs", "count": count, "wait": wait.as_secs_f64()}));
        let mut out = Vec::new();
        if let Some(m) = v["notifs"].as_object() {
            for (k, msgs) in m {
                for msg in msgs.as_array().into_iter().flatten() {
                    out.push((k.clone(), unhex(msg.as_str().unwrap_or_default())));
                }
            }
        }
        out
    }

    /// Kills the process now (SIGKILL).
    pub fn kill(&mut self) {
        self.py.kill();
    }
}

/// The byte pattern `nixl-core/testkit/py/nixl_peer.py` fills buffers with.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((i * 31 + seed) % 251) as u8)
        .collect()
}
