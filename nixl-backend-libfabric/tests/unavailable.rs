//! A missing libfabric is a typed `Unavailable` naming what to install, never a panic: this
//! test binary re-runs itself with `NIXL_LIBFABRIC_PATH` pointing at nothing (the library is
//! loaded once per process, so the check needs a fresh one).

use std::process::Command;

use nixl_backend_libfabric::{library_status, LibfabricParams};
use nixl_core::{Agent, AgentConfig, Error};

const ROLE: &str = "NIXL_LF_UNAVAILABLE_CHILD";

#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn child_without_library() {
    if std::env::var_os(ROLE).is_none() {
        return;
    }
    assert!(library_status().is_err());
    let a = Agent::new("no-libfabric", AgentConfig::default()).unwrap();
    match a.create_backend(LibfabricParams::default()) {
        Err(Error::Unavailable { what, hint }) => {
            assert!(what.contains("libfabric"), "{what}");
            assert!(
                hint.contains("libfabric1") && hint.contains("NIXL_LIBFABRIC_PATH"),
                "{hint}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(a.backends().is_empty());
}

#[test]
fn missing_library_is_unavailable() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "child_without_library",
            "--ignored",
            "--test-threads=1",
        ])
        .env(ROLE, "1")
        .env("NIXL_LIBFABRIC_PATH", "/nonexistent/libfabric.so.1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
