//! Telemetry: per-request timings and agent counters, named as NIXL's.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Timings and sizes of one request's latest post.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XferTelemetry {
    /// When the latest post started.
    pub start: Option<Instant>,
    /// How long `post` took.
    pub post_duration: Duration,
    /// From post to completion (zero while in flight).
    pub xfer_duration: Duration,
    /// Bytes moved.
    pub bytes: u64,
    /// Descriptors after merging.
    pub desc_count: usize,
}

/// Agent-wide counters.
#[derive(Debug, Default)]
pub struct Counters {
    enabled: AtomicBool,
    tx_bytes: AtomicU64,
    rx_bytes: AtomicU64,
    xfer_time_us: AtomicU64,
    xfer_post_time_us: AtomicU64,
    memory_registered: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
}

/// A snapshot of the agent's counters (NIXL's names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TelemetrySnapshot {
    /// Bytes written to peers (WRITE) — NIXL `agent_tx_bytes`.
    pub agent_tx_bytes: u64,
    /// Bytes read from peers (READ) — NIXL `agent_rx_bytes`.
    pub agent_rx_bytes: u64,
    /// Total transfer time in microseconds — NIXL `agent_xfer_time`.
    pub agent_xfer_time: u64,
    /// Total post time in microseconds — NIXL `agent_xfer_post_time`.
    pub agent_xfer_post_time: u64,
    /// Bytes currently registered — NIXL `agent_memory_registered`.
    pub agent_memory_registered: u64,
    /// Requests completed.
    pub agent_requests: u64,
    /// Requests that ended in an error.
    pub agent_errors: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Counters {
    /// Counters, enabled or not.
    pub fn new(enabled: bool) -> Self {
        let c = Counters::default();
        c.enabled.store(enabled, Ordering::Relaxed);
        c
    }

    /// Whether counting is on.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Switches counting on or off.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub(crate) fn completed(&self, write: bool, t: &XferTelemetry) {
        if !self.enabled() {
            return;
        }
        let c = if write {
            &self.tx_bytes
        } else {
            &self.rx_bytes
        };
        c.fetch_add(t.bytes, Ordering::Relaxed);
        self.xfer_time_us
            .fetch_add(micros(t.xfer_duration), Ordering::Relaxed);
        self.xfer_post_time_us
            .fetch_add(micros(t.post_duration), Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self) {
        if self.enabled() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn registered(&self, bytes: u64) {
        // Registered bytes are tracked even when telemetry is off so the gauge is right when
        // it is switched on later.
        self.memory_registered.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn deregistered(&self, bytes: u64) {
        self.memory_registered.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> TelemetrySnapshot {
        TelemetrySnapshot {
            agent_tx_bytes: self.tx_bytes.load(Ordering::Relaxed),
            agent_rx_bytes: self.rx_bytes.load(Ordering::Relaxed),
            agent_xfer_time: self.xfer_time_us.load(Ordering::Relaxed),
            agent_xfer_post_time: self.xfer_post_time_us.load(Ordering::Relaxed),
            agent_memory_registered: self.memory_registered.load(Ordering::Relaxed),
            agent_requests: self.requests.load(Ordering::Relaxed),
            agent_errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// Whether `NIXL_TELEMETRY_ENABLE` asks for telemetry ("1", "true", "yes", "on").
pub(crate) fn env_enabled() -> bool {
    std::env::var("NIXL_TELEMETRY_ENABLE")
        .map(|v| crate::params::parse_bool(&v) == Some(true))
        .unwrap_or(false)
}

#[cfg(feature = "prometheus")]
impl TelemetrySnapshot {
    /// Renders the counters in the Prometheus text exposition format, labelled with the agent.
    pub fn to_prometheus(&self, agent: &str) -> String {
        use std::fmt::Write;
        let label = agent.replace('\\', "\\\\").replace('"', "\\\"");
        let rows: [(&str, &str, &str, u64); 7] = [
            (
                "agent_tx_bytes",
                "counter",
                "Bytes written to peers",
                self.agent_tx_bytes,
            ),
            (
                "agent_rx_bytes",
                "counter",
                "Bytes read from peers",
                self.agent_rx_bytes,
            ),
            (
                "agent_xfer_time",
                "counter",
                "Transfer time in microseconds",
                self.agent_xfer_time,
            ),
            (
                "agent_xfer_post_time",
                "counter",
                "Post time in microseconds",
                self.agent_xfer_post_time,
            ),
            (
                "agent_memory_registered",
                "gauge",
                "Bytes registered",
                self.agent_memory_registered,
            ),
            (
                "agent_requests",
                "counter",
                "Requests completed",
                self.agent_requests,
            ),
            (
                "agent_errors",
                "counter",
                "Requests failed",
                self.agent_errors,
            ),
        ];
        let mut s = String::new();
        for (name, ty, help, v) in rows {
            let _ = writeln!(s, "# HELP nixl_{name} {help}");
            let _ = writeln!(s, "# TYPE nixl_{name} {ty}");
            let _ = writeln!(s, "nixl_{name}{{agent=\"{label}\"}} {v}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_when_enabled() {
        let c = Counters::new(false);
        let t = XferTelemetry {
            bytes: 10,
            ..Default::default()
        };
        c.completed(true, &t);
        assert_eq!(c.snapshot().agent_tx_bytes, 0);
        c.set_enabled(true);
        c.completed(true, &t);
        c.completed(false, &t);
        c.failed();
        let s = c.snapshot();
        assert_eq!(
            (
                s.agent_tx_bytes,
                s.agent_rx_bytes,
                s.agent_requests,
                s.agent_errors
            ),
            (10, 10, 2, 1)
        );
    }

    #[cfg(feature = "prometheus")]
    #[test]
    fn renders_prometheus_text() {
        let s = TelemetrySnapshot {
            agent_tx_bytes: 5,
            ..Default::default()
        }
        .to_prometheus("a\"b");
        assert!(s.contains("nixl_agent_tx_bytes{agent=\"a\\\"b\"} 5"));
        assert!(s.contains("# TYPE nixl_agent_memory_registered gauge"));
    }
}
