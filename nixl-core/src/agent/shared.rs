//! What every handle of an agent shares, and what it releases when the last one goes.

use super::*;

/// What an asynchronous metadata fetch ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FetchStatus {
    Pending,
    Failed(String),
}

pub(crate) struct Shared {
    pub name: String,
    pub generation: u64,
    pub config: AgentConfig,
    pub backends: RwLock<Vec<Arc<BackendSlot>>>,
    pub regs: Mutex<RegTable>,
    pub remotes: Mutex<HashMap<String, Arc<RemotePeer>>>,
    /// Per peer name: serialises loads and invalidations of that peer (never held by
    /// transfers, nor across other peers' loads).
    pub peer_locks: Mutex<HashMap<String, std::sync::Weak<Mutex<()>>>>,
    pub notifs: Arc<NotifQueue>,
    /// Leases this agent published and holds, and their control messages.
    pub leases: crate::lease::Leases,
    /// Wakes the agent's pending request futures (backends hold clones).
    pub wake: crate::backend::Wake,
    /// Whether the agent's progress thread runs (configured, or started for an async caller).
    pub progress_running: std::sync::atomic::AtomicBool,
    pub counters: Counters,
    pub fetches: Mutex<HashMap<String, FetchStatus>>,
    pub stop: Arc<AtomicBool>,
    pub listen_addr: Mutex<Option<SocketAddr>>,
    pub threads: Mutex<Vec<JoinHandle<()>>>,
    pub next_id: AtomicU64,
    /// Requests that ended uncertain (bounded, oldest dropped).
    pub uncertain: Mutex<VecDeque<UncertainXfer>>,
    /// Notifications whose integrity check failed, not yet taken: (sender, message).
    /// Notifications that failed their integrity check: (sender, message, already reported
    /// by `wait_notifs`).
    pub corrupt: Mutex<Vec<(String, Vec<u8>, bool)>>,
    /// Signs this agent's metadata and frames; verifies peers'.
    pub signer: Signer,
    /// Peer names bound to the credential that first loaded them.
    pub bindings: Arc<Bindings>,
    /// This process, as its metadata announces it (for peers' liveness watches).
    pub process: Option<crate::liveness::ProcessId>,
    /// This incarnation's hello key, and the key each peer name's hellos must verify under.
    pub hello_keys: Arc<crate::hello::HelloKeys>,
    /// What this incarnation's metadata says of its succession (`AgentConfig::succession`).
    pub succession: Option<crate::codec::Succession>,
    /// Peer names held for their successors.
    pub successions: super::peers::succession::Successions,
    /// Dropped requests the backends have not released yet (with their memory).
    pub draining: Mutex<Vec<crate::agent::request::Drained>>,
}

/// How many uncertain requests an agent remembers.
pub(crate) const MAX_UNCERTAIN: usize = 4096;

impl Shared {
    /// Whether the agent's progress thread drives the backends.
    pub(crate) fn progress_running(&self) -> bool {
        self.progress_running
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn backends(&self) -> Vec<Arc<BackendSlot>> {
        self.backends.read().clone()
    }

    /// The lock serialising loads and invalidations of peer `name`.
    pub(crate) fn peer_lock(&self, name: &str) -> Arc<Mutex<()>> {
        let mut locks = self.peer_locks.lock();
        if let Some(l) = locks.get(name).and_then(std::sync::Weak::upgrade) {
            return l;
        }
        if locks.len() >= 64 && locks.len().is_power_of_two() {
            locks.retain(|_, w| w.strong_count() > 0);
        }
        let l = Arc::new(Mutex::new(()));
        locks.insert(name.to_owned(), Arc::downgrade(&l));
        l
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn progress_all(&self) {
        self.progress_once();
    }

    /// One pass of [`Shared::progress_all`]; whether anything is going on (a backend made
    /// progress, or a dropped request still drains).
    fn progress_once(&self) -> bool {
        let mut busy = false;
        for slot in self.backends() {
            if slot.caps.needs_progress {
                match slot.backend.progress() {
                    Ok(any) => busy |= any,
                    Err(e) => {
                        tracing::warn!(agent = %self.name, backend = %slot.name, error = %e, "progress failed");
                    }
                }
            }
        }
        self.reap_drained() || busy
    }

    /// Releases dropped requests whose backends let go of them; whether some still drain.
    pub(crate) fn reap_drained(&self) -> bool {
        let mut d = self.draining.lock();
        if !d.is_empty() {
            d.retain_mut(|x| x.busy());
        }
        !d.is_empty()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        super::here::remove(self);
        let _ = self.reap_drained();
        // What backends still own is never freed under them: the process's orphan thread
        // keeps it until they let go (for good where they never do).
        let left = std::mem::take(&mut *self.draining.lock());
        if !left.is_empty() {
            tracing::warn!(agent = %self.name, requests = left.len(), "agent dropped with requests its backends still own; released when they let go");
            crate::agent::request::orphans::adopt(left);
        }
        self.stop.store(true, Ordering::SeqCst);
        // The side channel's accept loop waits in poll(2) for a connection: one wakes it now
        // (it sees the agent gone), so the join below does not wait for its tick.
        if let Some(addr) = *self.listen_addr.lock() {
            crate::exchange::accept::wake(addr);
        }
        let me = std::thread::current().id();
        for t in std::mem::take(&mut *self.threads.lock()) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        // A leaked request keeps its backend alive: its threads stop here, not never.
        for slot in self.backends.get_mut().drain(..) {
            slot.backend.shutdown();
        }
    }
}

/// Starts the agent's progress thread, once (an async caller on a backend that needs progress
/// starts it when the configuration did not).
/// The longest the progress thread sleeps when nothing happens.
const IDLE_MAX: Duration = Duration::from_millis(1);

pub(crate) fn start_progress_thread(shared: &Arc<Shared>) -> Result<()> {
    if shared.progress_running.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    spawn_progress_thread(shared)
}

/// Starts the progress thread from the timer thread, not the caller's (a future's poll must
/// not pay for a thread's start): the caller goes on at once and the thread runs shortly
/// after. Where the timer thread is not running, the thread is started here.
pub(crate) fn start_progress_thread_soon(shared: &Arc<Shared>) -> Result<()> {
    if shared.progress_running.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let weak = Arc::downgrade(shared);
    let job = Box::new(move || {
        if let Some(shared) = weak.upgrade() {
            if let Err(e) = spawn_progress_thread(&shared) {
                tracing::error!(agent = %shared.name, error = %e, "could not start the progress thread");
            }
            // The agent dropped meanwhile: its teardown (joining its threads, closing its
            // backends) must not hold up the timer thread, which serves every deadline.
            if Arc::strong_count(&shared) == 1 {
                let _ = std::thread::Builder::new()
                    .name("nixl-agent-drop".to_owned())
                    .spawn(move || drop(shared));
            }
        }
    });
    match crate::model::timer::run_soon(job) {
        Ok(()) => Ok(()),
        Err(_) => spawn_progress_thread(shared),
    }
}

/// Spawns the progress thread; `progress_running` is already set (and is cleared on failure).
fn spawn_progress_thread(shared: &Arc<Shared>) -> Result<()> {
    crate::model::timer::note_thread_started();
    let weak = Arc::downgrade(shared);
    let stop = shared.stop.clone();
    let delay = shared.config.progress_delay;
    let handle = std::thread::Builder::new()
        .name(format!("nixl-progress-{}", shared.name))
        .spawn(move || {
            // `delay` between passes while something happens, doubling up to IDLE_MAX while
            // nothing does: an idle agent costs a wake-up per IDLE_MAX, not per `delay`.
            let mut sleep = delay;
            while !stop.load(Ordering::Relaxed) {
                let Some(shared) = weak.upgrade() else { break };
                let busy = shared.progress_once();
                drop(shared);
                crate::model::timer::fire_due();
                sleep = if busy {
                    delay
                } else {
                    (sleep * 2).clamp(delay, IDLE_MAX.max(delay))
                };
                std::thread::sleep(sleep);
            }
        })
        .map_err(|e| {
            shared.progress_running.store(false, Ordering::SeqCst);
            Error::io(&shared.name, Op::Progress, e)
        })?;
    shared.threads.lock().push(handle);
    Ok(())
}
