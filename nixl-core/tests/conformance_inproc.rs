//! The conformance suite, one test per case, against the in-process backend: copies inside
//! `post`, with an agent progress thread, copies deferred to the completion thread (so cancel,
//! drop, deadlines and notification ordering act on data really in flight), and the fault
//! injector around INPROC (pass-through, and holding every post back for a delay).

use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::fault::{FaultLog, FaultParams, FaultPlan};
use nixl_core::backend::inproc::Completion;
use nixl_core::{AgentConfig, InprocParams};
use nixl_testkit::conformance::Suite;

fn inproc() -> Option<Suite> {
    Some(Suite::new(
        "inproc",
        AgentConfig::default(),
        Arc::new(|a| a.create_backend(InprocParams::default())),
    ))
}

fn inproc_progress_thread() -> Option<Suite> {
    let config = AgentConfig::default().progress_thread(true);
    Some(Suite::new(
        "inproc-pt",
        config,
        Arc::new(|a| a.create_backend(InprocParams::default())),
    ))
}

fn deferred() -> InprocParams {
    InprocParams::default().completion(Completion::Deferred(Duration::from_millis(50)))
}

fn inproc_deferred() -> Option<Suite> {
    Some(Suite::new(
        "inproc-deferred",
        AgentConfig::default(),
        Arc::new(|a| a.create_backend(deferred())),
    ))
}

fn fault_inproc() -> Option<Suite> {
    Some(Suite::new(
        "fault-inproc",
        AgentConfig::default(),
        Arc::new(|a| {
            a.create_backend(FaultParams::new(
                InprocParams::default(),
                FaultPlan::default(),
                FaultLog::new(),
            ))
        }),
    ))
}

fn fault_inproc_delayed() -> Option<Suite> {
    let plan = FaultPlan::default()
        .seed(11)
        .delay_prob(1.0)
        .delay((Duration::from_millis(50), Duration::from_millis(100)));
    Some(Suite::new(
        "fault-inproc-delayed",
        AgentConfig::default(),
        Arc::new(move |a| {
            a.create_backend(FaultParams::new(
                InprocParams::default(),
                plan.clone(),
                FaultLog::new(),
            ))
        }),
    ))
}

mod immediate {
    nixl_testkit::conformance_tests!(super::inproc);
}

mod progress_thread {
    nixl_testkit::conformance_tests!(super::inproc_progress_thread);
}

mod deferred {
    nixl_testkit::conformance_tests!(super::inproc_deferred);
}

mod fault_passthrough {
    nixl_testkit::conformance_tests!(super::fault_inproc);
}

mod fault_delayed {
    nixl_testkit::conformance_tests!(super::fault_inproc_delayed);
}

/// The in-flight cases cannot apply where copies finish inside `post`, and say so with the
/// property that excludes them; with deferred completion they run.
#[test]
fn in_flight_cases_apply_only_where_data_is_in_flight() {
    use nixl_testkit::conformance::{run_case, Outcome};
    for case in [
        "cancel_in_flight_is_final",
        "drop_in_flight_is_final",
        "deadline_in_flight_is_final",
    ] {
        let immediate = run_case(&inproc().unwrap(), case);
        assert!(
            matches!(
                immediate,
                Ok(Outcome::NotApplicable {
                    capability: "completes inside post",
                    ..
                })
            ),
            "{case} immediate: {immediate:?}"
        );
        let deferred = run_case(&inproc_deferred().unwrap(), case);
        assert_eq!(deferred, Ok(Outcome::Passed), "{case} deferred");
    }
}
