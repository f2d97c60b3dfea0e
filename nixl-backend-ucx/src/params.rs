//! The backend's parameters: typed fields with defaults, and the string-map boundary form.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use nixl_core::backend::ParamMap;
use nixl_core::{Error, Op, Result};

use crate::wire::MAX_WORKERS;
use crate::UCX;

/// Parameters of the UCX backend.
///
/// ```
/// use nixl_backend_ucx::UcxParams;
/// let p = UcxParams::default().transports("tcp".to_string());
/// assert_eq!(p.num_workers, 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UcxParams {
    /// Where to load UCX from: a prefix (holding `lib/libucp.so.0`), a `lib` directory or the
    /// `libucp` file. `None`: `$NIXL_UCX_HOME`, then `$UCX_HOME`, then [`crate::DEPS_HOME`], then
    /// the system's `libucp.so.0`.
    pub library_path: Option<PathBuf>,
    /// Transports UCX may use (`UCX_TLS`, e.g. `"tcp"`, `"shm,cma,self"`, `"rc,cuda_ipc"`).
    /// `None`: UCX's default (all), or the `UCX_TLS` environment variable.
    pub transports: Option<String>,
    /// Network devices (`UCX_NET_DEVICES`, e.g. `"mlx5_0:1"`, `"eth0"`, `"lo"`). `None`:
    /// `UCX_NET_DEVICES` from the environment if set, else every RDMA port of this host and
    /// the loopback interface: UCX's tcp transport, whose emulated puts write wherever a
    /// connecting process tells them whatever the cluster credential, listens on 127.0.0.1
    /// only. Name the interfaces tcp may use between hosts here, or opt out with
    /// [`UcxParams::tcp_on_every_interface`].
    pub devices: Option<String>,
    /// Let UCX's tcp transport listen on every interface of the host when [`UcxParams::devices`]
    /// names none (UCX's own default). Off by default: see `devices`.
    pub tcp_on_every_interface: bool,
    /// Number of UCP workers; requests are spread over them round robin. 1..=64.
    pub num_workers: usize,
    /// Run a progress thread per worker (sleeping on the worker's event descriptor), so
    /// emulated RMA to this agent and notifications complete without the application
    /// polling.
    pub progress_thread: bool,
    /// How long `cancel` waits for a transfer before force-closing its endpoint.
    pub cancel_timeout: Duration,
    /// UCX keep-alive interval (`UCX_KEEPALIVE_INTERVAL`): how soon a silent dead peer is
    /// detected. Over tcp it also bounds how long sent data may stay unacknowledged
    /// (`UCX_TCP_USER_TIMEOUT`, [`TCP_USER_TIMEOUT_FACTOR`] times the interval, at least a
    /// second; UCX 1.22 and later, where the option exists): without that, a peer behind a
    /// failed link is never declared dead while a
    /// transfer to it is in flight (UCX's keep-alive messages queue behind the unacknowledged
    /// data), so the request can only time out and its memory must then be kept, as UCX
    /// cannot confirm it stopped. Default: [`DEFAULT_KEEPALIVE`]. `None`: off (UCX's own
    /// defaults: the system's TCP timeouts, minutes, for a pulled cable).
    pub keepalive_interval: Option<Duration>,
    /// Further UCX options, names without the `UCX_` prefix (`("RNDV_THRESH", "8k")`).
    pub config: Vec<(String, String)>,
    /// Mirror a NIXL agent's UCX context, for peers that are stock NIXL agents
    /// (`nixl_core::nixl_wire`): context features `RMA|AMO32|AMO64|AM|WAKEUP` and UCX's
    /// default address version (v1) instead of v2, so both sides select lanes from the same
    /// inputs. NIXL peers are reachable without it, on less tested paths.
    pub nixl_compat: bool,
    /// Send notifications to peers on the same host over shared memory (a second endpoint
    /// per peer, without UCX peer error handling, used for notifications only; data and
    /// failure detection stay on the first). UCX carries active messages over shared memory
    /// only on such endpoints, so without it same-host notifications go over loopback TCP
    /// (~20 us instead of ~3 us from post to the target seeing it on the dev VM). Not used
    /// for stock NIXL peers.
    pub shm_notifications: bool,
    /// Copy host memory to and from peers on the same host with the backend's own
    /// `process_vm_writev`/`process_vm_readv` calls, many segments per call, wherever UCX
    /// itself would use its `cma` transport for them (`crate` docs, "Direct CMA"): the same
    /// kernel copies without one system call and UCX's protocol layers per segment. The path
    /// says `direct CMA`. Not used for stock NIXL peers (their metadata names no process).
    pub direct_cma: bool,
    /// Threads that copy large direct CMA requests (above 1 MiB): such a post returns at
    /// once (as with UCX's own copies, which its progress thread makes), and the request's
    /// pieces (256 KiB each) are copied by these threads and by the application's own `check`,
    /// at the same time. `0`: every direct copy is made inside `post`. Default: a quarter of
    /// the machine's cores, 1 to 4. On machines of 8 cores or more a thread polls for more
    /// work for 200 us after each piece before it sleeps. At most 64.
    pub cma_threads: usize,
    /// Direct CMA to agents of this same process too (default off). A peer's metadata says
    /// where its regions are; a copy to a process of this host lands where it says, and one to
    /// this process would land in this process's own memory, so metadata naming this process
    /// is trusted only when the caller says so (tests, benchmarks, in-process agent pairs).
    /// Without it such peers get UCX's copies, as before direct CMA.
    pub direct_cma_same_process: bool,
    /// How long a progress thread keeps polling its worker after the last event before it
    /// sleeps on the worker's event descriptor ([`DEFAULT_PROGRESS_SPIN`]; zero: it sleeps at
    /// once). Over UCX's tcp, where a peer's READ of this agent's memory is served by this
    /// thread, a back-to-back stream of small requests then finds the thread awake instead of
    /// paying a wake-up each (NIXL's progress thread polls without ever sleeping): on the
    /// 2-core VM an 8 KiB READ's p50 went from 43 to 26 us, NIXL's 29 (docs/perf/scale.md).
    /// It costs a core for this long after each event (yielding to other runnable threads
    /// while it polls); an idle agent sleeps. At most 10 ms.
    pub progress_spin: Duration,
    /// Connect each worker with a temporary worker of its own, both ways, when the backend
    /// is created (default off), so that UCX selects its lanes and protocols then and not
    /// during the first request to a peer. Over UCX's tcp that selection is most of a first
    /// contact: on the 2-core VM 7.8-8.2 ms became 1.0-1.1 ms with it, the backend's start
    /// 16-17 ms longer (docs/perf/scale.md). With UCX's shared-memory transports on one host
    /// it shortened the p99 of first contact there but lengthened its median, so it is not
    /// the default: turn it on for peers reached over the network.
    pub warm_up: bool,
}

nixl_core::__setters!(UcxParams {
    tcp_on_every_interface: bool,
    num_workers: usize,
    progress_thread: bool,
    cancel_timeout: Duration,
    config: Vec<(String, String)>,
    nixl_compat: bool,
    shm_notifications: bool,
    direct_cma: bool,
    cma_threads: usize,
    direct_cma_same_process: bool,
    progress_spin: Duration,
    warm_up: bool,
} some {
    library_path: PathBuf,
    transports: String,
    devices: String,
    keepalive_interval: Duration,
});

/// The default of [`UcxParams::keepalive_interval`]: a peer behind a pulled cable is declared
/// dead after about four intervals of unacknowledged data (`UCX_TCP_USER_TIMEOUT`), 8 s.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(2);

/// The default of [`UcxParams::progress_spin`].
pub const DEFAULT_PROGRESS_SPIN: Duration = Duration::from_micros(50);

/// The default of [`UcxParams::cma_threads`]: a quarter of the cores, 1 to 4.
pub fn default_cma_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() / 4)
        .unwrap_or(1)
        .clamp(1, 4)
}

impl Default for UcxParams {
    fn default() -> Self {
        UcxParams {
            library_path: None,
            transports: None,
            devices: None,
            tcp_on_every_interface: false,
            num_workers: 1,
            progress_thread: true,
            cancel_timeout: Duration::from_secs(5),
            keepalive_interval: Some(DEFAULT_KEEPALIVE),
            config: Vec::new(),
            nixl_compat: false,
            shm_notifications: true,
            direct_cma: true,
            cma_threads: default_cma_threads(),
            direct_cma_same_process: false,
            progress_spin: DEFAULT_PROGRESS_SPIN,
            warm_up: false,
        }
    }
}

/// `UCX_TCP_USER_TIMEOUT` is this many keep-alive intervals (see
/// [`UcxParams::keepalive_interval`]).
pub const TCP_USER_TIMEOUT_FACTOR: u32 = 4;

fn bad(reason: impl Into<String>) -> Error {
    Error::invalid("", Op::CreateBackend, reason)
}

fn nonempty(k: &str, v: &str) -> Result<()> {
    if v.trim().is_empty() || v.contains('\0') {
        Err(bad(format!("UCX parameter {k} must be non-empty text")))
    } else {
        Ok(())
    }
}

impl UcxParams {
    /// Checks the values.
    pub fn validate(&self) -> Result<()> {
        if self.num_workers == 0 || self.num_workers > MAX_WORKERS {
            return Err(bad(format!(
                "num_workers must be 1..={MAX_WORKERS}, not {}",
                self.num_workers
            )));
        }
        if let Some(t) = &self.transports {
            nonempty("transports", t)?;
        }
        if let Some(d) = &self.devices {
            nonempty("devices", d)?;
        }
        if self.cma_threads > 64 {
            return Err(bad(format!(
                "cma_threads must be 0..=64, not {}",
                self.cma_threads
            )));
        }
        if self.cancel_timeout.is_zero() {
            return Err(bad("cancel_timeout must be positive"));
        }
        if self.progress_spin > Duration::from_millis(10) {
            return Err(bad(format!(
                "progress_spin must be at most 10 ms, not {:?}",
                self.progress_spin
            )));
        }
        if self.keepalive_interval.is_some_and(|d| d.is_zero()) {
            return Err(bad("keepalive_interval must be positive"));
        }
        for (k, v) in &self.config {
            nonempty("config name", k)?;
            if v.contains('\0') {
                return Err(bad(format!("UCX option {k} contains a NUL byte")));
            }
        }
        Ok(())
    }

    /// UCX configuration pairs these params set: the tuned defaults (each skipped when the
    /// user set its `UCX_*` variable or [`UcxParams::config`] names it), then the params.
    pub(crate) fn ucx_config(&self, version: (u32, u32, u32)) -> Vec<(String, String)> {
        let mut v = Vec::new();
        // The settings NIXL applies: without an infinite rendezvous threshold UCX (1.22) picks
        // software-emulated puts over tcp instead of CMA zero-copy between local processes
        // when peer error handling is on.
        let mut defaults = vec![("RNDV_THRESH", "inf"), ("MAX_RMA_RAILS", "2")];
        // Connecting never blocks: UCX's tcp transport otherwise connects with a blocking
        // connect() inside ucp_ep_create, under the worker's lock, which every post, check and
        // notification of the agent needs: a peer whose host went silent froze them all for as
        // long as the kernel retries the SYN (minutes). Non-blocking, the connection completes
        // (or fails) in progress, and requests to that peer end by their own deadline.
        defaults.push(("TCP_CONN_NB", "y"));
        if !self.nixl_compat {
            // NIXL asks for v2 only with EFA devices; UCX's default is v1.
            defaults.push(("ADDRESS_VERSION", "v2"));
        }
        if (version.0, version.1) >= (1, 19) {
            defaults.push(("MAX_COMPONENT_MDS", "32"));
        }
        for (k, val) in defaults {
            let overridden = std::env::var_os(format!("UCX_{k}")).is_some()
                || self.config.iter().any(|(n, _)| n == k);
            if !overridden {
                v.push((k.to_owned(), val.to_owned()));
            }
        }
        if let Some(t) = &self.transports {
            v.push(("TLS".to_owned(), t.clone()));
        }
        if let Some(d) = &self.devices {
            v.push(("NET_DEVICES".to_owned(), d.clone()));
        } else if !self.tcp_on_every_interface
            && std::env::var_os("UCX_NET_DEVICES").is_none()
            && !self.config.iter().any(|(n, _)| n == "NET_DEVICES")
        {
            v.push(("NET_DEVICES".to_owned(), default_devices()));
            // With the devices chosen here, tcp has one interface (loopback), so UCX's
            // preference for the default route's interface chooses nothing; UCX checks it by
            // reading /proc/net/route on each of its ~190 interface queries while a first
            // endpoint's protocols are selected: 10-14 ms of a 44-48 ms first contact over tcp
            // on the 2-core VM (docs/perf/data/vm-2026-11-30-first-contact/).
            let user_set = std::env::var_os("UCX_TCP_PREFER_DEFAULT").is_some()
                || self.config.iter().any(|(n, _)| n == "TCP_PREFER_DEFAULT");
            if !user_set {
                v.push(("TCP_PREFER_DEFAULT".to_owned(), "n".to_owned()));
            }
        }
        if let Some(k) = self.keepalive_interval {
            v.push((
                "KEEPALIVE_INTERVAL".to_owned(),
                format!("{}ms", k.as_millis().max(1)),
            ));
            let user_set = std::env::var_os("UCX_TCP_USER_TIMEOUT").is_some()
                || self.config.iter().any(|(n, _)| n == "TCP_USER_TIMEOUT");
            // UCX has the option from 1.22 on (NIXL 1.3's wheel carries UCX 1.21, which
            // refuses the name): older ones detect a silent peer by keep-alive alone.
            if !user_set && (version.0, version.1) >= (1, 22) {
                let t = (k * TCP_USER_TIMEOUT_FACTOR).max(Duration::from_secs(1));
                v.push((
                    "TCP_USER_TIMEOUT".to_owned(),
                    format!("{}ms", t.as_millis()),
                ));
            }
        }
        v.extend(self.config.iter().cloned());
        v
    }

    /// The string-map form (every key [`UcxParams::from_map`] reads).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let opt = |o: &Option<String>| o.clone().unwrap_or_default();
        m.insert(
            "ucx_path".into(),
            self.library_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        );
        m.insert("transports".into(), opt(&self.transports));
        m.insert("devices".into(), opt(&self.devices));
        m.insert(
            "tcp_on_every_interface".into(),
            self.tcp_on_every_interface.to_string(),
        );
        m.insert("num_workers".into(), self.num_workers.to_string());
        m.insert("progress_thread".into(), self.progress_thread.to_string());
        m.insert("nixl_compat".into(), self.nixl_compat.to_string());
        m.insert(
            "shm_notifications".into(),
            self.shm_notifications.to_string(),
        );
        m.insert("direct_cma".into(), self.direct_cma.to_string());
        m.insert("cma_threads".into(), self.cma_threads.to_string());
        m.insert(
            "direct_cma_same_process".into(),
            self.direct_cma_same_process.to_string(),
        );
        m.insert(
            "progress_spin_us".into(),
            self.progress_spin.as_micros().to_string(),
        );
        m.insert("warm_up".into(), self.warm_up.to_string());
        m.insert(
            "cancel_timeout_ms".into(),
            self.cancel_timeout.as_millis().to_string(),
        );
        m.insert(
            "keepalive_interval_ms".into(),
            self.keepalive_interval
                .map_or_else(|| "off".to_owned(), |d| d.as_millis().to_string()),
        );
        for (k, v) in &self.config {
            m.insert(format!("ucx.{k}"), v.clone());
        }
        m
    }

    /// Parses the string-map form: `ucx_path`, `transports`, `devices`,
    /// `tcp_on_every_interface`, `num_workers`, `progress_thread`, `cancel_timeout_ms`,
    /// `keepalive_interval_ms` (`off` turns it off), `nixl_compat`,
    /// `shm_notifications`, `direct_cma`, `cma_threads`, `direct_cma_same_process`,
    /// `progress_spin_us`, `warm_up`, and `ucx.<OPTION>`.
    /// Empty values mean "default". Unknown keys are refused.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Self> {
        let mut m = ParamMap::new(UCX, map);
        let (tls, alias) = (m.string("transports"), m.string("ucx_tls"));
        let mut p = UcxParams {
            library_path: m.string("ucx_path").map(PathBuf::from),
            transports: tls.or(alias),
            devices: m.string("devices"),
            config: m.prefixed("ucx.")?,
            ..UcxParams::default()
        };
        match m.string("keepalive_interval_ms").as_deref() {
            Some("off") => p.keepalive_interval = None,
            _ => {
                if let Some(d) = m.millis("keepalive_interval_ms")? {
                    p.keepalive_interval = Some(d);
                }
            }
        }
        if let Some(b) = m.bool("tcp_on_every_interface")? {
            p.tcp_on_every_interface = b;
        }
        if let Some(n) = m.usize("num_workers")? {
            p.num_workers = n;
        }
        if let Some(b) = m.bool("progress_thread")? {
            p.progress_thread = b;
        }
        if let Some(b) = m.bool("nixl_compat")? {
            p.nixl_compat = b;
        }
        if let Some(b) = m.bool("shm_notifications")? {
            p.shm_notifications = b;
        }
        if let Some(b) = m.bool("direct_cma")? {
            p.direct_cma = b;
        }
        if let Some(n) = m.usize("cma_threads")? {
            p.cma_threads = n;
        }
        if let Some(b) = m.bool("direct_cma_same_process")? {
            p.direct_cma_same_process = b;
        }
        if let Some(d) = m.millis("cancel_timeout_ms")? {
            p.cancel_timeout = d;
        }
        if let Some(us) = m.usize("progress_spin_us")? {
            p.progress_spin = Duration::from_micros(us as u64);
        }
        if let Some(b) = m.bool("warm_up")? {
            p.warm_up = b;
        }
        m.finish()?;
        p.validate()?;
        Ok(p)
    }
}

/// Every RDMA port of this host (`/sys/class/infiniband/<device>/ports/<n>`, as UCX names them:
/// `mlx5_0:1`) and the loopback interface: what UCX may use when no device is named, so that
/// its tcp transport listens on 127.0.0.1 only.
pub(crate) fn default_devices() -> String {
    let mut v = Vec::new();
    if let Ok(devs) = std::fs::read_dir("/sys/class/infiniband") {
        for d in devs.flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            if let Ok(ports) = std::fs::read_dir(d.path().join("ports")) {
                for p in ports.flatten() {
                    v.push(format!("{name}:{}", p.file_name().to_string_lossy()));
                }
            }
        }
    }
    v.sort();
    v.push("lo".to_owned());
    v.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_roundtrips() {
        let p = UcxParams {
            library_path: Some("/opt/ucx".into()),
            transports: Some("tcp".into()),
            devices: Some("lo".into()),
            tcp_on_every_interface: true,
            num_workers: 3,
            progress_thread: false,
            cancel_timeout: Duration::from_millis(1500),
            keepalive_interval: Some(Duration::from_millis(200)),
            config: vec![("RNDV_THRESH".into(), "8k".into())],
            nixl_compat: true,
            shm_notifications: false,
            direct_cma: false,
            cma_threads: 3,
            direct_cma_same_process: true,
            progress_spin: Duration::from_micros(50),
            warm_up: true,
        };
        assert_eq!(UcxParams::from_map(&p.to_map()).unwrap(), p);
        assert_eq!(
            UcxParams::from_map(&UcxParams::default().to_map()).unwrap(),
            UcxParams::default()
        );
    }

    #[test]
    fn keepalive_bounds_unacknowledged_tcp_data() {
        let get = |p: &UcxParams, k: &str| {
            p.ucx_config((1, 22, 0))
                .into_iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v)
                .collect::<Vec<_>>()
        };
        let mut p = UcxParams {
            keepalive_interval: Some(Duration::from_millis(500)),
            ..UcxParams::default()
        };
        assert_eq!(get(&p, "KEEPALIVE_INTERVAL"), ["500ms"]);
        assert_eq!(get(&p, "TCP_USER_TIMEOUT"), ["2000ms"]);
        p.keepalive_interval = Some(Duration::from_millis(10));
        assert_eq!(get(&p, "TCP_USER_TIMEOUT"), ["1000ms"], "at least a second");
        p.config = vec![("TCP_USER_TIMEOUT".into(), "30s".into())];
        assert_eq!(
            get(&p, "TCP_USER_TIMEOUT"),
            ["30s"],
            "the user's value wins"
        );
        assert_eq!(get(&UcxParams::default(), "TCP_USER_TIMEOUT"), ["8000ms"]);
        let off = UcxParams {
            keepalive_interval: None,
            ..UcxParams::default()
        };
        assert!(get(&off, "TCP_USER_TIMEOUT").is_empty());
        assert!(get(&off, "KEEPALIVE_INTERVAL").is_empty());
        // UCX 1.21 (NIXL 1.3's wheel) has no such option: not set there, keep-alive is.
        let old = UcxParams::default().ucx_config((1, 21, 0));
        assert!(!old.iter().any(|(n, _)| n == "TCP_USER_TIMEOUT"), "{old:?}");
        assert!(
            old.iter().any(|(n, _)| n == "KEEPALIVE_INTERVAL"),
            "{old:?}"
        );
        assert_eq!(UcxParams::from_map(&off.to_map()).unwrap(), off);
    }

    #[test]
    fn the_default_route_check_is_off_only_where_tcp_has_one_interface() {
        let has = |p: &UcxParams| {
            p.ucx_config((1, 22, 0))
                .iter()
                .any(|(k, v)| k == "TCP_PREFER_DEFAULT" && v == "n")
        };
        if std::env::var_os("UCX_NET_DEVICES").is_none()
            && std::env::var_os("UCX_TCP_PREFER_DEFAULT").is_none()
        {
            assert!(has(&UcxParams::default()));
        }
        assert!(!has(&UcxParams::default().devices("eth0,eth1".to_owned())));
        assert!(!has(&UcxParams::default().tcp_on_every_interface(true)));
        let own = UcxParams::default().config(vec![("TCP_PREFER_DEFAULT".into(), "y".into())]);
        assert!(own
            .ucx_config((1, 22, 0))
            .iter()
            .all(|(k, v)| k != "TCP_PREFER_DEFAULT" || v == "y"));
    }

    #[test]
    fn bad_values_are_refused() {
        for (k, v) in [
            ("num_workers", "0"),
            ("num_workers", "65"),
            ("num_workers", "x"),
            ("progress_thread", "maybe"),
            ("nixl_compat", "perhaps"),
            ("shm_notifications", "often"),
            ("direct_cma", "sometimes"),
            ("warm_up", "later"),
            ("cma_threads", "65"),
            ("cma_threads", "-1"),
            ("progress_spin_us", "10001"),
            ("progress_spin_us", "-1"),
            ("cancel_timeout_ms", "0"),
            ("keepalive_interval_ms", "-1"),
            ("bogus", "1"),
            ("ucx.", "1"),
            ("transports", " "),
        ] {
            let m = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            assert!(
                matches!(UcxParams::from_map(&m), Err(Error::InvalidParam { .. })),
                "{k}={v}"
            );
        }
    }
}
