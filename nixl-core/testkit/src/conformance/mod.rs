//! The backend conformance suite: one set of behaviours every backend must show, run by each
//! backend crate against its real transport.
//!
//! Each case is its own test: [`conformance_tests!`](crate::conformance_tests) generates one
//! `#[test]` per case for a [`Suite`], so a case can fail, and run, alone. A case that needs a
//! capability the backend does not declare (remote transfers, notifications, DRAM, storage) is
//! reported as not applicable, naming that capability ([`crate::not_applicable`]),
//! never as passed. The case `capabilities_match_behaviour` checks the declaration against
//! behaviour: what is declared must work (remote WRITEs land, notifications arrive, loopback
//! copies), and what is not declared must be refused with a typed error and change nothing —
//! so the cases reported not applicable are exactly the operations the agent will never run
//! on this backend.
//!
//! ```
//! use std::sync::Arc;
//! use nixl_testkit::conformance::Suite;
//! use nixl_core::{AgentConfig, InprocParams};
//!
//! fn inproc() -> Option<Suite> {
//!     Some(Suite::new("inproc", AgentConfig::default(), Arc::new(|a| a.create_backend(InprocParams::default()))))
//! }
//! // In a test file: one #[test] per case, e.g. `inproc::write_then_read_by_block_index`.
//! mod inproc_cases {
//!     nixl_testkit::conformance_tests!(super::inproc);
//! }
//! ```

mod caps;
mod inflight;
mod notify;
mod storage;
mod transfer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::Capabilities;
use nixl_core::{
    Agent, AgentConfig, BackendHandle, Error, HostBuffer, MemKind, MemoryRegion, Result,
};

/// Makes a backend on a fresh agent and returns its handle.
pub type CreateFn = Arc<dyn Fn(&Agent) -> Result<BackendHandle> + Send + Sync>;
/// Makes a storage region (a file, an object) of the given size.
pub type StorageFn = Arc<dyn Fn(u64) -> Result<Arc<dyn MemoryRegion>> + Send + Sync>;

/// What to run the suite against.
#[derive(Clone)]
pub struct Suite {
    /// A label for agent names and messages.
    pub name: String,
    /// The configuration of every agent the suite creates.
    pub config: AgentConfig,
    /// Creates the backend under test on an agent.
    pub create: CreateFn,
    /// For storage backends: creates a storage region of a given size.
    pub storage: Option<StorageFn>,
}

impl std::fmt::Debug for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Suite")
            .field("name", &self.name)
            .field("storage", &self.storage.is_some())
            .finish_non_exhaustive()
    }
}

impl Suite {
    /// A suite for a transport backend.
    pub fn new(name: &str, config: AgentConfig, create: CreateFn) -> Self {
        Suite {
            name: name.to_owned(),
            config,
            create,
            storage: None,
        }
    }
}

/// How a case ended when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every check of the case ran and held.
    Passed,
    /// The case does not apply to this backend.
    NotApplicable {
        /// The capability (or property) that excludes it: `remote`, `notifications`, `local`,
        /// `dram`, `storage`, `transport`, `completes inside post`.
        capability: &'static str,
        /// Why, in words.
        reason: String,
    },
}

/// A case's result: its [`Outcome`], or what failed.
pub type CaseResult = std::result::Result<Outcome, String>;

type Res = std::result::Result<(), String>;

/// What a case needs from the backend under test.
#[derive(Debug, Clone, Copy)]
enum Need {
    Dram,
    Remote,
    Local,
    Notifications,
    /// A storage suite ([`Suite::storage`]).
    Storage,
    /// A transport suite (no storage regions).
    Transport,
}

impl Need {
    fn excludes(self, c: &Capabilities, s: &Suite) -> Option<Outcome> {
        let na = |capability, reason: &str| {
            Some(Outcome::NotApplicable {
                capability,
                reason: reason.to_owned(),
            })
        };
        match self {
            Need::Dram if !c.supports(MemKind::Dram) => na("dram", "registers no DRAM"),
            Need::Remote if !c.remote => na("remote", "declares no transfers to other agents"),
            Need::Local if !c.local => na("local", "declares no transfers to the agent itself"),
            Need::Notifications if !c.notifications => na("notifications", "declares none"),
            Need::Storage if s.storage.is_none() => na(
                "storage",
                "a transport backend (the suite has no storage regions)",
            ),
            Need::Transport if s.storage.is_some() => na(
                "transport",
                "a storage backend: its local transfers go to storage",
            ),
            _ => None,
        }
    }
}

struct Case {
    name: &'static str,
    needs: &'static [Need],
    run: fn(&Suite) -> CaseResult,
}

fn passed(r: Res) -> CaseResult {
    r.map(|()| Outcome::Passed)
}

/// The names of every case, in order (one `#[test]` each from
/// [`conformance_tests!`](crate::conformance_tests)).
pub const CASES: &[&str] = &[
    "capabilities_are_consistent",
    "capabilities_match_behaviour",
    "write_then_read_by_block_index",
    "notification_follows_data",
    "notification_changes_per_post",
    "standalone_notifications_keep_order",
    "repost_after_completion",
    "bad_descriptors_are_refused",
    "invalidated_peer_fails_requests",
    "registration_in_use_is_kept",
    "concurrent_requests_on_one_agent",
    "loopback_transfer",
    "storage_roundtrip",
    "storage_out_of_range_is_refused",
    "cancel_in_flight_is_final",
    "drop_in_flight_is_final",
    "deadline_in_flight_is_final",
];

fn table() -> Vec<Case> {
    use Need::*;
    let c = |name, needs, run| Case { name, needs, run };
    vec![
        c("capabilities_are_consistent", &[], |s| {
            passed(caps::capabilities_are_consistent(s))
        }),
        c("capabilities_match_behaviour", &[], |s| {
            passed(caps::capabilities_match_behaviour(s))
        }),
        c("write_then_read_by_block_index", &[Remote, Dram], |s| {
            passed(transfer::write_then_read_by_block_index(s))
        }),
        c(
            "notification_follows_data",
            &[Remote, Dram, Notifications],
            |s| passed(notify::notification_follows_data(s)),
        ),
        c(
            "notification_changes_per_post",
            &[Remote, Dram, Notifications],
            |s| passed(notify::notification_changes_per_post(s)),
        ),
        c(
            "standalone_notifications_keep_order",
            &[Remote, Dram, Notifications],
            |s| passed(notify::standalone_notifications_keep_order(s)),
        ),
        c("repost_after_completion", &[Remote, Dram], |s| {
            passed(transfer::repost_after_completion(s))
        }),
        c("bad_descriptors_are_refused", &[Remote, Dram], |s| {
            passed(transfer::bad_descriptors_are_refused(s))
        }),
        c("invalidated_peer_fails_requests", &[Remote, Dram], |s| {
            passed(transfer::invalidated_peer_fails_requests(s))
        }),
        c("registration_in_use_is_kept", &[Dram], |s| {
            passed(transfer::registration_in_use_is_kept(s))
        }),
        c("concurrent_requests_on_one_agent", &[Remote, Dram], |s| {
            passed(transfer::concurrent_requests_on_one_agent(s))
        }),
        c("loopback_transfer", &[Local, Dram, Transport], |s| {
            passed(transfer::loopback_transfer(s))
        }),
        c("storage_roundtrip", &[Storage, Local, Dram], |s| {
            passed(storage::storage_roundtrip(s))
        }),
        c("storage_out_of_range_is_refused", &[Storage], |s| {
            passed(storage::storage_out_of_range_is_refused(s))
        }),
        c("cancel_in_flight_is_final", &[Remote, Dram], |s| {
            inflight::stop_in_flight(s, inflight::Stop::Cancel)
        }),
        c("drop_in_flight_is_final", &[Remote, Dram], |s| {
            inflight::stop_in_flight(s, inflight::Stop::Drop)
        }),
        c("deadline_in_flight_is_final", &[Remote, Dram], |s| {
            inflight::stop_in_flight(s, inflight::Stop::Deadline)
        }),
    ]
}

/// Runs one case (by its name in [`CASES`]) against the suite: not applicable when the
/// backend's declared capabilities exclude it, else its checks.
pub fn run_case(suite: &Suite, name: &str) -> CaseResult {
    let case = table()
        .into_iter()
        .find(|c| c.name == name)
        .ok_or_else(|| format!("no conformance case named {name}"))?;
    if !case.needs.is_empty() {
        let (a, b) = agent(suite, "needs")?;
        let c = caps(&a, &b)?;
        if let Some(na) = case.needs.iter().find_map(|n| n.excludes(&c, suite)) {
            return Ok(na);
        }
    }
    (case.run)(suite)
}

/// Runs every case.
pub fn run_all(suite: &Suite) -> Vec<(&'static str, CaseResult)> {
    CASES.iter().map(|n| (*n, run_case(suite, n))).collect()
}

/// Reports a case's outcome for the test named `test`: panics when it failed, reports a
/// not-applicable case through [`crate::not_applicable`].
pub fn report(test: &str, result: CaseResult) {
    match result {
        Ok(Outcome::Passed) => {}
        Ok(Outcome::NotApplicable { capability, reason }) => {
            crate::not_applicable(test, capability, reason)
        }
        Err(e) => panic!("conformance case {test} failed: {e}"),
    }
}

/// Runs every case and panics listing the failures (not-applicable cases are reported). Prefer
/// [`conformance_tests!`](crate::conformance_tests): one test per case.
pub fn assert_all(suite: &Suite) {
    let mut failed = Vec::new();
    for (n, r) in run_all(suite) {
        match r {
            Err(e) => failed.push(format!("{n}: {e}")),
            ok => report(&format!("{}::{n}", suite.name), ok),
        }
    }
    assert!(
        failed.is_empty(),
        "conformance failures for {}:\n{}",
        suite.name,
        failed.join("\n")
    );
}

/// The body of each test [`conformance_tests!`](crate::conformance_tests) generates: makes the
/// suite (`None`: a dependency is missing, already reported with [`crate::skip`]),
/// runs the case and reports it.
pub fn check(case: &str, make: impl FnOnce() -> Option<Suite>) {
    let Some(suite) = make() else {
        return;
    };
    report(&format!("{}::{case}", suite.name), run_case(&suite, case));
}

/// Checks that a list of generated tests covers [`CASES`] exactly.
#[doc(hidden)]
pub fn assert_case_list(generated: &[&str]) {
    assert_eq!(
        generated, CASES,
        "conformance_tests! and conformance::CASES disagree"
    );
}

/// Generates one `#[test]` per conformance case, named after the case, for the suite a
/// function returns (`fn() -> Option<Suite>`; `None` when a dependency is missing, after
/// reporting it with [`skip`](crate::skip)). Put it in its own module per
/// suite:
///
/// ```ignore
/// mod tcp {
///     nixl_testkit::conformance_tests!(super::tcp_suite);
/// }
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::conformance_tests!(@cases $make;
            capabilities_are_consistent,
            capabilities_match_behaviour,
            write_then_read_by_block_index,
            notification_follows_data,
            notification_changes_per_post,
            standalone_notifications_keep_order,
            repost_after_completion,
            bad_descriptors_are_refused,
            invalidated_peer_fails_requests,
            registration_in_use_is_kept,
            concurrent_requests_on_one_agent,
            loopback_transfer,
            storage_roundtrip,
            storage_out_of_range_is_refused,
            cancel_in_flight_is_final,
            drop_in_flight_is_final,
            deadline_in_flight_is_final
        );
    };
    (@cases $make:path; $($case:ident),+) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::check(stringify!($case), $make);
            }
        )+
        #[test]
        fn every_case_has_a_test() {
            $crate::conformance::assert_case_list(&[$(stringify!($case)),+]);
        }
    };
}

const TIMEOUT: Duration = Duration::from_secs(20);

static SEQ: AtomicU64 = AtomicU64::new(0);

fn agent(s: &Suite, role: &str) -> std::result::Result<(Agent, BackendHandle), String> {
    let name = format!(
        "{}-{role}-{}-{}",
        s.name,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let a = Agent::new(&name, s.config.clone()).map_err(|e| e.to_string())?;
    let b = (s.create)(&a).map_err(|e| format!("creating the backend: {e}"))?;
    Ok((a, b))
}

fn caps(a: &Agent, b: &BackendHandle) -> std::result::Result<Capabilities, String> {
    ensure(a.backends().contains(b), || {
        format!("{b} is not a backend of {}", a.name())
    })?;
    Ok(b.capabilities().clone())
}

fn buf(len: usize) -> std::result::Result<Arc<HostBuffer>, String> {
    HostBuffer::new(len)
        .map(Arc::new)
        .ok_or_else(|| "allocation failed".to_owned())
}

fn e2s(what: &str) -> impl FnOnce(Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Res {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

fn storage_fn(s: &Suite) -> std::result::Result<&StorageFn, String> {
    s.storage
        .as_ref()
        .ok_or_else(|| "not a storage suite".to_owned())
}

/// Two connected agents with one registered buffer each (initiator `a`, target `b`).
struct Pair {
    a: Agent,
    b: Agent,
    backend: BackendHandle,
    src: Arc<HostBuffer>,
    dst: Arc<HostBuffer>,
    _regs: (nixl_core::Registration, nixl_core::Registration),
}

fn pair(s: &Suite, len: usize) -> std::result::Result<Pair, String> {
    let (a, backend) = agent(s, "init")?;
    let (b, _) = agent(s, "target")?;
    let src = buf(len)?;
    let dst = buf(len)?;
    let ra = a
        .register_mem(vec![src.clone()], &[])
        .map_err(e2s("register initiator"))?;
    let rb = b
        .register_mem(vec![dst.clone()], &[])
        .map_err(e2s("register target"))?;
    let md = b.local_metadata().map_err(e2s("target metadata"))?;
    let name = a
        .load_remote_metadata(&md)
        .map_err(e2s("load target metadata"))?;
    ensure(name == b.name(), || {
        format!("loaded {name}, expected {}", b.name())
    })?;
    // The target also learns the initiator (for notifications back and symmetric setups).
    let md = a.local_metadata().map_err(e2s("initiator metadata"))?;
    b.load_remote_metadata(&md)
        .map_err(e2s("load initiator metadata"))?;
    Ok(Pair {
        a,
        b,
        backend,
        src,
        dst,
        _regs: (ra, rb),
    })
}
