//! The backend's typed parameters, its plugin (string map → params), and the stats handle.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::ParamMap;
use nixl_core::{Error, Op, Result};

use crate::rail::RailCounters;
use crate::result::LIBFABRIC;

/// Providers tried, in order, when [`LibfabricParams::provider`] is `None`.
pub const DEFAULT_PROVIDERS: [&str; 4] = ["efa", "tcp", "shm", "sockets"];

/// Whether device (CUDA) memory is registered through libfabric's `FI_HMEM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HmemMode {
    /// Ask for `FI_HMEM`; fall back to host memory only when the provider lacks it.
    #[default]
    Auto,
    /// Host memory only.
    Off,
    /// Fail creation unless the provider offers `FI_HMEM`.
    Require,
}

/// Parameters of the libfabric backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LibfabricParams {
    /// The provider (`"efa"`, `"tcp"`, `"shm"`, `"sockets"`, `"verbs"`, ...); `None` picks the
    /// first of [`DEFAULT_PROVIDERS`] that offers RDM endpoints with RMA and messages.
    pub provider: Option<String>,
    /// Domains to open rails on (EFA devices such as `rdmap16s27-rdm`, or `lo` for tcp), used
    /// round-robin; empty: every domain the provider reports, in its order.
    pub domains: Vec<String>,
    /// How many rails (endpoints, each on its own domain) to stripe transfers over.
    pub rails: usize,
    /// A segment of at least twice this many bytes is split across rails; smaller segments
    /// go whole to the least-loaded rail.
    pub stripe_min: u64,
    /// Device memory through `FI_HMEM`.
    pub hmem: HmemMode,
    /// Run a progress thread in the backend (libfabric's tcp, shm and efa providers progress
    /// only when polled, at the target too). Without it the agent must call `progress`.
    pub progress_thread: bool,
    /// How long a progress thread of a polled rail (no CQ wait object: shm, efa) sleeps when
    /// idle. A target's provider may need its progress to complete a write (shm, efa), so
    /// this bounds the latency a passive target adds; lower it for latency, raise it to save
    /// CPU on many idle agents.
    pub idle_sleep: Duration,
    /// Largest notification message in bytes (the sender's name included).
    pub notif_size: usize,
    /// Receive buffers posted for notifications.
    pub notif_slots: usize,
    /// The bound on the backend's own waits (sending a notification, draining a canceled or
    /// failed request).
    pub op_timeout: Duration,
    /// Where the created backend publishes its per-rail counters (clones share them; see
    /// [`LibfabricParams::stats`]).
    pub stats: LibfabricStats,
}

nixl_core::__setters!(LibfabricParams {
    domains: Vec<String>,
    rails: usize,
    stripe_min: u64,
    hmem: HmemMode,
    progress_thread: bool,
    idle_sleep: Duration,
    notif_size: usize,
    notif_slots: usize,
    op_timeout: Duration,
} some {
    provider: String,
});

impl Default for LibfabricParams {
    fn default() -> Self {
        LibfabricParams {
            provider: None,
            domains: Vec::new(),
            rails: 1,
            stripe_min: 64 * 1024,
            hmem: HmemMode::Auto,
            progress_thread: true,
            idle_sleep: Duration::from_micros(50),
            notif_size: 16 * 1024,
            notif_slots: 64,
            op_timeout: Duration::from_secs(10),
            stats: LibfabricStats::default(),
        }
    }
}

impl LibfabricParams {
    /// Parameters for one provider.
    pub fn with_provider(provider: &str) -> Self {
        LibfabricParams {
            provider: Some(provider.to_owned()),
            ..Default::default()
        }
    }

    /// The tcp provider on loopback (`lo`) with `rails` rails: what tests and single-host
    /// benches use.
    pub fn tcp_loopback(rails: usize) -> Self {
        LibfabricParams {
            provider: Some("tcp".to_owned()),
            domains: vec!["lo".to_owned()],
            rails,
            ..Default::default()
        }
    }

    /// A handle to the per-rail counters of the backend created from these parameters.
    pub fn stats(&self) -> LibfabricStats {
        self.stats.clone()
    }

    /// Sets `stats`: the backend created from these parameters publishes its counters there
    /// (the setter is not named as the field, which [`stats`](Self::stats) reads).
    #[must_use]
    pub fn with_stats(mut self, stats: LibfabricStats) -> Self {
        self.stats = stats;
        self
    }

    pub(crate) fn validate(&self, agent: &str) -> Result<()> {
        let bad = |r: &str| {
            Err(Error::invalid(
                agent,
                Op::CreateBackend,
                format!("LIBFABRIC: {r}"),
            ))
        };
        if self.rails == 0 || self.rails > 64 {
            return bad("rails must be 1..=64");
        }
        if self.stripe_min == 0 {
            return bad("stripe_min must be positive");
        }
        if self.notif_size < 64 || self.notif_size > 16 << 20 {
            return bad("notif_size must be 64 B ..= 16 MiB");
        }
        if self.notif_slots == 0 || self.notif_slots > 4096 {
            return bad("notif_slots must be 1..=4096");
        }
        if self.idle_sleep > Duration::from_millis(100) {
            return bad("idle_sleep must be at most 100 ms");
        }
        if self.op_timeout.is_zero() {
            return bad("op_timeout must be positive");
        }
        if matches!(&self.provider, Some(p) if p.is_empty() || p.contains('\0')) {
            return bad("provider name is empty or contains NUL");
        }
        if self
            .domains
            .iter()
            .any(|d| d.is_empty() || d.contains('\0'))
        {
            return bad("a domain name is empty or contains NUL");
        }
        Ok(())
    }
}

/// Creates `LIBFABRIC` by name from a string map. Keys: `provider`, `domains` (comma
/// separated), `rails`, `stripe_min`, `hmem` (`auto`/`off`/`require`), `progress_thread`,
/// `idle_sleep_us`, `notif_size`, `notif_slots`, `op_timeout_ms`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LibfabricPlugin;

impl LibfabricParams {
    /// The string-map form of the defaults (the plugin's `default_params`).
    pub(crate) fn default_map() -> BTreeMap<String, String> {
        let d = LibfabricParams::default();
        BTreeMap::from([
            ("provider".to_owned(), String::new()),
            ("domains".to_owned(), String::new()),
            ("rails".to_owned(), d.rails.to_string()),
            ("stripe_min".to_owned(), d.stripe_min.to_string()),
            ("hmem".to_owned(), "auto".to_owned()),
            ("progress_thread".to_owned(), d.progress_thread.to_string()),
            (
                "idle_sleep_us".to_owned(),
                d.idle_sleep.as_micros().to_string(),
            ),
            ("notif_size".to_owned(), d.notif_size.to_string()),
            ("notif_slots".to_owned(), d.notif_slots.to_string()),
            (
                "op_timeout_ms".to_owned(),
                d.op_timeout.as_millis().to_string(),
            ),
        ])
    }

    /// Parses the string-map form (the plugin's `parse_params`).
    pub(crate) fn from_map(params: &BTreeMap<String, String>) -> Result<Self> {
        let mut m = ParamMap::new("LIBFABRIC", params);
        let mut p = LibfabricParams {
            provider: m.string("provider"),
            ..LibfabricParams::default()
        };
        if let Some(d) = m.str("domains") {
            p.domains = d
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(n) = m.usize("rails")? {
            p.rails = n;
        }
        if let Some(n) = m.u64("stripe_min")? {
            p.stripe_min = n;
        }
        if let Some(h) = m.parse::<HmemMode>("hmem", "auto, off or require")? {
            p.hmem = h;
        }
        if let Some(b) = m.bool("progress_thread")? {
            p.progress_thread = b;
        }
        if let Some(us) = m.u64("idle_sleep_us")? {
            p.idle_sleep = Duration::from_micros(us);
        }
        if let Some(n) = m.usize("notif_size")? {
            p.notif_size = n;
        }
        if let Some(n) = m.usize("notif_slots")? {
            p.notif_slots = n;
        }
        if let Some(d) = m.millis("op_timeout_ms")? {
            p.op_timeout = d;
        }
        m.finish()?;
        p.validate("")?;
        Ok(p)
    }
}

nixl_core::__backend_plugin!(LibfabricPlugin, LibfabricParams, LIBFABRIC, |p, ctx| {
    crate::backend::LibfabricBackend::new(ctx, p)
});

impl std::str::FromStr for HmemMode {
    type Err = ();

    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(HmemMode::Auto),
            "off" => Ok(HmemMode::Off),
            "require" => Ok(HmemMode::Require),
            _ => Err(()),
        }
    }
}

/// Counters of one rail at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RailStats {
    /// The rail's index.
    pub rail: usize,
    /// Its domain (NIC or interface).
    pub domain: String,
    /// Bytes this agent wrote through it (completed).
    pub bytes_written: u64,
    /// Bytes this agent read through it (completed).
    pub bytes_read: u64,
    /// RMA operations completed.
    pub ops: u64,
    /// Operations that completed with an error.
    pub errors: u64,
    /// Notifications sent.
    pub notifs_sent: u64,
    /// Notifications received.
    pub notifs_received: u64,
    /// Over shm: region locks released because the peer that held them had exited while a
    /// post spun on them (see the crate's docs on shm peers that die).
    pub dead_locks_released: u64,
    /// Over shm: a peer died with operations of this rail in flight, and libfabric's shm
    /// endpoint completes nothing posted after them; posts on the rail are refused (a
    /// `Backend` error saying so) until the agent is recreated.
    pub blocked: bool,
}

/// A handle to the per-rail counters of a backend (from [`LibfabricParams::stats`] before
/// creating it, or [`crate::LibfabricBackend::stats`]).
#[derive(Debug, Clone, Default)]
pub struct LibfabricStats {
    rails: Arc<Mutex<Vec<NamedCounters>>>,
}

/// A rail's domain name and counters.
type NamedCounters = (String, Arc<RailCounters>);

impl LibfabricStats {
    pub(crate) fn attach(&self, rails: Vec<NamedCounters>) {
        *self.rails.lock() = rails;
    }

    /// The counters of every rail (empty before the backend exists).
    pub fn rails(&self) -> Vec<RailStats> {
        let g = self.rails.lock();
        g.iter()
            .enumerate()
            .map(|(i, (d, c))| RailStats {
                rail: i,
                domain: d.clone(),
                bytes_written: c.bytes_written.load(Ordering::Relaxed),
                bytes_read: c.bytes_read.load(Ordering::Relaxed),
                ops: c.ops.load(Ordering::Relaxed),
                errors: c.errors.load(Ordering::Relaxed),
                notifs_sent: c.notifs_sent.load(Ordering::Relaxed),
                notifs_received: c.notifs_received.load(Ordering::Relaxed),
                dead_locks_released: c.dead_locks_released.load(Ordering::Relaxed),
                blocked: c.blocked.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nixl_core::backend::BackendPlugin;

    #[test]
    fn plugin_parses_and_refuses() {
        let pl = LibfabricPlugin;
        let mut m = BTreeMap::new();
        m.insert("provider".to_owned(), "tcp".to_owned());
        m.insert("domains".to_owned(), "lo, eth0".to_owned());
        m.insert("rails".to_owned(), "2".to_owned());
        assert!(pl.parse_params(&m).is_ok());
        assert!(pl.parse_params(&pl.default_params()).is_ok());
        for (k, v) in [
            ("rails", "0"),
            ("rails", "x"),
            ("hmem", "maybe"),
            ("bogus", "1"),
            ("notif_size", "1"),
            ("op_timeout_ms", "0"),
            ("idle_sleep_us", "1000000"),
        ] {
            let m = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            assert!(
                matches!(pl.parse_params(&m), Err(Error::InvalidParam { .. })),
                "{k}={v} accepted"
            );
        }
    }
}
