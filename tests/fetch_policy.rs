//! Reading is opt-in (issue 34, item 5), on one host without a credential: with
//! `FetchPolicy::LoadedPeers` a victim serves its metadata (the keys to its memory) only to
//! the processes it loaded; another process of the same user is refused, typed, and learns
//! nothing; a process whose metadata the victim loaded fetches. With `FetchPolicy::Named` only
//! the loaded peers it lists: another loaded peer is refused. Every actor is a process of its
//! own (the kernel names it over the Unix side channel). Over credentials:
//! `nixl-core/tests/side_channel_security.rs::a_fetch_policy_serves_loaded_peers_only`.

use std::time::Duration;

use nixl::access::FetchPolicy;
use nixl::{Agent, AgentConfig};
use nixl_testkit::two_process::{child_main, Child};

const CHILD: &str = "fetcher_role";
const WAIT: Duration = Duration::from_secs(60);

fn config(policy: FetchPolicy) -> AgentConfig {
    nixl::agent_config()
        .listen(true)
        .default_timeout(Duration::from_secs(20))
        .fetch_policy(policy)
}

/// Fetches the parent's metadata, first pushing its own where told (`push` = 1); exits 0 when
/// the outcome is the expected one (`expect` = ok or refused).
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn fetcher_role() {
    child_main(|env| {
        let a = Agent::new(&env.name, config(FetchPolicy::Anyone)).map_err(|e| e.to_string())?;
        if env.var("push")? == "1" {
            a.send_local_metadata(env.parent_addr)
                .map_err(|e| format!("push: {e}"))?;
        }
        let got = a.fetch_remote_metadata_blocking(&env.parent, env.parent_addr, WAIT);
        match (env.var("expect")?.as_str(), got) {
            ("ok", Ok(name)) if name == env.parent => Ok(()),
            ("refused", Err(e)) if e.kind() == nixl::core::ErrorKind::NotAllowed => {
                if a.remotes().is_empty() {
                    Ok(())
                } else {
                    Err("refused, yet something was loaded".into())
                }
            }
            (want, got) => Err(format!("expected {want}, got {got:?}")),
        }
    });
}

fn run(victim: &Agent, name: &str, push: bool, expect: &str) {
    let mut c = Child::spawn(
        CHILD,
        victim,
        name,
        &[("push", if push { "1" } else { "0" }), ("expect", expect)],
    )
    .expect("spawn");
    let st = c.join(WAIT).expect("the fetcher exits");
    assert_eq!(
        st.code(),
        Some(0),
        "{name} (push {push}, expect {expect}): {st}"
    );
}

#[test]
fn loaded_peers_only_fetch_on_one_host() {
    let pid = std::process::id();
    let victim = Agent::new(
        &format!("policy-victim-{pid}"),
        config(FetchPolicy::LoadedPeers),
    )
    .expect("victim");
    // Another process of this user, not loaded: refused.
    run(&victim, &format!("stranger-{pid}"), false, "refused");
    // A process the victim loaded (its own PUSH, checked against the kernel's word): served.
    run(&victim, &format!("peer-{pid}"), true, "ok");
    // Named: only the loaded peers listed; another loaded peer (its PUSH accepted) is refused.
    let listed = format!("listed-{pid}");
    let named = Agent::new(
        &format!("policy-named-{pid}"),
        config(FetchPolicy::Named(vec![listed.clone()])),
    )
    .expect("named");
    run(&named, &format!("unlisted-{pid}"), true, "refused");
    run(&named, &listed, true, "ok");
    // The default serves any process of this user.
    let open =
        Agent::new(&format!("policy-open-{pid}"), config(FetchPolicy::Anyone)).expect("open");
    run(&open, &format!("anyone-{pid}"), false, "ok");
}
