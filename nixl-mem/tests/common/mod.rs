//! Helpers of the GPU tests: skipping, patterns, child processes.
#![allow(dead_code)]

use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// Whether the test can run; prints why not.
pub fn gpu(test: &str) -> bool {
    match nixl_mem::cuda::driver() {
        Ok(()) => true,
        Err(e) => {
            nixl_core::testing::skip(
                test,
                nixl_core::testing::Dep::Gpu,
                format!("no usable CUDA GPU here ({e})"),
            );
            false
        }
    }
}

/// A deterministic byte pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The first differing offset, for readable failures.
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

pub const ROLE: &str = "NIXL_MEM_TEST_ROLE";

/// Runs this test binary's test `name` in a child process with extra env, bounded in time.
pub fn run_child(name: &str, env: &[(&str, String)], timeout: Duration) -> ExitStatus {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn child");
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("wait child") {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {name} ran past {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}
