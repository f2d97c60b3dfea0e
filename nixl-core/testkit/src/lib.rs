//! nixl-rs's test kit (not published): the skip policy, the two-process and network-namespace
//! harnesses, the backend conformance suite, and helpers every crate's tests share.
//!
//! Skipping tests honestly: a test whose dependency is missing says so, and a run that is
//! supposed to have that dependency fails instead of passing in zero seconds.
//!
//! libtest has no "skipped" outcome, so a test that cannot run returns early and counts as
//! passed. [`skip`] makes that visible and checkable:
//!
//! - it prints `SKIPPED[dep] test: reason` to stderr;
//! - it appends `dep<TAB>test<TAB>reason` to the file named by [`ENV_SKIP_LOG`]
//!   (`NIXL_SKIP_LOG`), so a CI script can count skips by reason;
//! - when the dependency is required here it panics instead, failing the test. A dependency
//!   is required when [`ENV_REQUIRE_DEPS`] (`NIXL_REQUIRE_DEPS`) is `1`/`all` and
//!   [`ENV_ALLOW_SKIP`] (`NIXL_ALLOW_SKIP`, comma separated [`Dep::name`]s) does not list it,
//!   or when `NIXL_REQUIRE_DEPS` lists it by name.
//!
//! `scripts/test.sh` sets `NIXL_REQUIRE_DEPS=1` and allows only what a CPU machine cannot
//! have (a GPU, EFA, FI_HMEM, nvidia-fs) and UCX 1.23 (not yet packaged), so a missing UCX,
//! libfabric, etcd or S3 server fails CI (`scripts/check-required-deps.sh` proves it).
//! Conformance cases a backend's capabilities exclude are reported with [`not_applicable`];
//! [`two_process`] is the harness for tests that spawn a child agent.
//!
//! ```
//! use nixl_testkit::{skip, Dep};
//! fn my_test() {
//!     if std::env::var_os("MY_GPU").is_none() {
//!         skip("my_test", Dep::Gpu, "no GPU here");
//!         return;
//!     }
//!     // ...
//! }
//! # let _ = my_test;
//! ```
//!
//! [`netns`] builds several "hosts" (network, PID, mount, IPC and UTS namespaces) joined by
//! virtual links on one Linux machine, for tests that must cross a real network path.

// Test code: a failed set-up step panics the test that asked for it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Display;
use std::io::Write;

pub mod conformance;
pub mod executor;
#[cfg(feature = "gpu")]
pub mod gpu;
mod helpers;
pub mod kv;
#[cfg(feature = "libfabric")]
pub mod libfabric;
#[cfg(feature = "py")]
pub mod py_child;
pub mod s3;
#[cfg(feature = "py")]
pub mod torch_store;
pub mod two_process;
#[cfg(feature = "ucx")]
pub mod ucx;
pub mod wrapped;

pub use helpers::{
    eventually, first_diff, hex, host_buf, inproc_agent, inproc_agent_with, pattern, registered,
    run_child, snapshot, unhex, unique, Snapshot,
};

/// Environment variable: `1` or `all` requires every dependency not allowed to skip; else a
/// comma-separated list of [`Dep::name`]s that are required.
pub const ENV_REQUIRE_DEPS: &str = "NIXL_REQUIRE_DEPS";
/// Environment variable: comma-separated [`Dep::name`]s that may skip under
/// `NIXL_REQUIRE_DEPS=1`.
pub const ENV_ALLOW_SKIP: &str = "NIXL_ALLOW_SKIP";
/// Environment variable: a file every skip is appended to (one line per skip).
pub const ENV_SKIP_LOG: &str = "NIXL_SKIP_LOG";

#[cfg(target_os = "linux")]
pub mod netns;

/// Something a test may need that a machine may not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dep {
    /// A loadable UCX (`scripts/deps/ucx.sh`).
    Ucx,
    /// A loadable libfabric with its tcp/shm providers (`scripts/deps/libfabric.sh`).
    Libfabric,
    /// The `etcd` server binary (`scripts/deps/etcd.sh`).
    Etcd,
    /// An S3 test server (`scripts/deps/gds.sh`).
    S3,
    /// io_uring in this kernel.
    IoUring,
    /// NIXL itself (the nixl-cu13 wheel) for interoperability tests.
    Nixl,
    /// Network namespaces and veth pairs (root, iproute2).
    Netns,
    /// A CUDA GPU and driver.
    Gpu,
    /// Two or more CUDA GPUs.
    MultiGpu,
    /// A ROCm GPU.
    RocmGpu,
    /// An AWS EFA device.
    Efa,
    /// A libfabric provider with FI_HMEM (GPU memory registration).
    FiHmem,
    /// GPUDirect Storage's kernel driver (nvidia-fs) or a cuFile that accepts the files here.
    NvidiaFs,
    /// A CUDA-aware UCX (cuda transports).
    CudaUcx,
    /// UCX 1.23 or later: several workers per backend over UCX's tcp transport (1.22 crashes
    /// in its tcp put emulation there; docs/reliability.md).
    Ucx123,
    /// Root: starting a process as another user.
    Root,
    /// PyTorch (`torch.distributed`), for its own c10d TCPStore.
    Torch,
}

impl Dep {
    /// The name used in `NIXL_REQUIRE_DEPS`, `NIXL_ALLOW_SKIP` and the skip log.
    pub fn name(self) -> &'static str {
        match self {
            Dep::Ucx => "ucx",
            Dep::Libfabric => "libfabric",
            Dep::Etcd => "etcd",
            Dep::S3 => "s3",
            Dep::IoUring => "io-uring",
            Dep::Nixl => "nixl",
            Dep::Netns => "netns",
            Dep::Gpu => "gpu",
            Dep::MultiGpu => "multi-gpu",
            Dep::RocmGpu => "rocm-gpu",
            Dep::Efa => "efa",
            Dep::FiHmem => "fi-hmem",
            Dep::NvidiaFs => "nvidia-fs",
            Dep::CudaUcx => "cuda-ucx",
            Dep::Ucx123 => "ucx-1.23",
            Dep::Root => "root",
            Dep::Torch => "torch",
        }
    }
}

impl Display for Dep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `dep` is required under the given environment values.
fn required_by(dep: Dep, require: Option<&str>, allow: Option<&str>) -> bool {
    let list = |s: &str| {
        s.split(',')
            .map(str::trim)
            .any(|n| n.eq_ignore_ascii_case(dep.name()))
    };
    match require.map(str::trim) {
        None | Some("") | Some("0") => false,
        Some("1") | Some("all") => !allow.is_some_and(list),
        Some(names) => list(names),
    }
}

/// Whether this run requires `dep` (see the module docs).
pub fn is_required(dep: Dep) -> bool {
    required_by(
        dep,
        std::env::var(ENV_REQUIRE_DEPS).ok().as_deref(),
        std::env::var(ENV_ALLOW_SKIP).ok().as_deref(),
    )
}

/// Reports that `test` cannot run because `dep` is missing, for the reason given. The caller
/// returns early afterwards. Panics (failing the test) when this run requires `dep`.
#[track_caller]
pub fn skip(test: &str, dep: Dep, reason: impl Display) {
    let reason = reason.to_string().replace(['\n', '\t'], " ");
    log_skip(dep.name(), test, &reason);
    if is_required(dep) {
        panic!("{test}: requires {dep}, which this run must have ({ENV_REQUIRE_DEPS}): {reason}");
    }
    eprintln!("SKIPPED[{dep}] {test}: {reason}");
}

/// Reports that `test` does not apply to what it runs against: a conformance case that a
/// backend's declared `capability` excludes (its conformance suite checks that the
/// declaration matches the behaviour). Printed as `NOT APPLICABLE[capability] test: reason`
/// and appended to the skip log as `n/a:capability<TAB>test<TAB>reason`, so CI counts it by
/// capability; it never fails a run (nothing is missing: the case has nothing to check).
pub fn not_applicable(test: &str, capability: &str, reason: impl Display) {
    let reason = reason.to_string().replace(['\n', '\t'], " ");
    log_skip(&format!("n/a:{capability}"), test, &reason);
    eprintln!("NOT APPLICABLE[{capability}] {test}: {reason}");
}

fn log_skip(what: &str, test: &str, reason: &str) {
    if let Some(path) = std::env::var_os(ENV_SKIP_LOG) {
        let line = format!("{what}\t{test}\t{reason}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("{test}: could not append to the skip log: {e}");
        }
    }
}

/// Stopping, continuing and killing processes a test started (a peer that stalls, a server
/// that freezes), without an external `kill` binary (a minimal system has none).
pub mod signal {
    use rustix::process::{kill_process, Pid, Signal};

    /// A signal a test sends.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Sig {
        /// `SIGSTOP`: freeze (cannot be caught).
        Stop,
        /// `SIGCONT`: thaw.
        Cont,
        /// `SIGKILL`.
        Kill,
        /// `SIGTERM`.
        Term,
    }

    /// Sends `sig` to process `pid`; the OS error when it could not be delivered.
    pub fn send(pid: u32, sig: Sig) -> std::io::Result<()> {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let s = match sig {
            Sig::Stop => Signal::STOP,
            Sig::Cont => Signal::CONT,
            Sig::Kill => Signal::KILL,
            Sig::Term => Signal::TERM,
        };
        kill_process(pid, s).map_err(std::io::Error::from)?;
        if sig == Sig::Stop {
            // The kernel stops the process when it next runs: wait for it (bounded), so a test
            // that stops a peer and acts at once really acts on a stopped peer.
            wait_stopped(pid.as_raw_nonzero().get());
        }
        Ok(())
    }

    /// Waits up to 2 s until `/proc/<pid>/stat` shows the process stopped (`T`) or gone.
    fn wait_stopped(pid: i32) {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < end {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return;
            };
            // The state follows the command name, which is in parentheses.
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next());
            if matches!(state, Some("T" | "t" | "Z" | "X") | None) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_reach_a_child_and_bad_pids_are_errors() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        signal::send(child.id(), signal::Sig::Stop).unwrap();
        // Stopped when `send` returns, not some time later.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        let state = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .next();
        assert_eq!(state, Some("T"), "{stat}");
        signal::send(child.id(), signal::Sig::Cont).unwrap();
        signal::send(child.id(), signal::Sig::Kill).unwrap();
        let st = child.wait().unwrap();
        assert!(!st.success());
        assert!(signal::send(0, signal::Sig::Term).is_err());
        assert!(signal::send(u32::MAX, signal::Sig::Term).is_err());
    }

    #[test]
    fn requirement_rules() {
        assert!(!required_by(Dep::Ucx, None, None));
        assert!(!required_by(Dep::Ucx, Some("0"), None));
        assert!(required_by(Dep::Ucx, Some("1"), None));
        assert!(required_by(Dep::Ucx, Some("all"), Some("gpu,efa")));
        assert!(!required_by(Dep::Gpu, Some("1"), Some("gpu, efa")));
        assert!(required_by(Dep::Etcd, Some("ucx,etcd"), None));
        assert!(!required_by(Dep::S3, Some("ucx,etcd"), None));
    }

    #[test]
    fn names_are_unique() {
        let all = [
            Dep::Ucx,
            Dep::Libfabric,
            Dep::Etcd,
            Dep::S3,
            Dep::IoUring,
            Dep::Nixl,
            Dep::Netns,
            Dep::Gpu,
            Dep::MultiGpu,
            Dep::RocmGpu,
            Dep::Efa,
            Dep::FiHmem,
            Dep::NvidiaFs,
            Dep::CudaUcx,
            Dep::Ucx123,
            Dep::Root,
        ];
        let mut names: Vec<&str> = all.iter().map(|d| d.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }
}
