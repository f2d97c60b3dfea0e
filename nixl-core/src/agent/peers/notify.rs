//! Notifications: reading them (drained, waited for, dropped counts, integrity failures,
//! uncertain requests) and sending them.

// Exception to the crate's `deny(unsafe_code)`: an integrity frame is checked by hashing
// registered ranges held for the check (`sys::host::hash_ranges`, SAFETY at the call).
#![allow(unsafe_code)]

use crate::agent::*;

impl Agent {
    /// Drains received notifications: sender name to messages, in per-sender order.
    ///
    /// Nothing is lost in silence: when notifications were dropped since the last read (the
    /// queue was full, [`crate::Limits::max_queued_notif_bytes`]), this read reports them
    /// first, whatever else is queued: [`Error::LimitExceeded`] naming how many from each
    /// sender, with the queued messages left for the next read ([`Agent::dropped_notifs`] has
    /// the totals).
    #[doc(alias = "getNotifs")]
    pub fn get_notifs(&self) -> Result<Notifs> {
        if !self.shared.progress_running() {
            self.shared.progress_all();
        }
        self.report_drops()?;
        let mut n = self.shared.notifs.drain();
        self.verify_integrity(&mut n);
        Ok(n)
    }

    /// `LimitExceeded` naming the notifications dropped since the last report, if any.
    fn report_drops(&self) -> Result<()> {
        let drops = self.shared.notifs.take_unreported_drops();
        if drops.is_empty() {
            return Ok(());
        }
        let mut list: Vec<String> = drops
            .iter()
            .map(|(sender, n)| format!("{n} from {sender}"))
            .collect();
        list.sort();
        Err(Error::limit(
            self.name(),
            Op::GetNotifs,
            format!(
                "queued notification bytes: dropped {} since the last read (see Agent::dropped_notifs); what was queued is kept for the next read",
                list.join(", ")
            ),
            self.shared.config.limits.max_queued_notif_bytes,
        ))
    }

    /// Checks integrity frames (see `XferOptions::integrity`): a verified frame becomes the
    /// user's message; a failed one is removed and kept for [`Agent::take_integrity_failures`].
    fn verify_integrity(&self, notifs: &mut Notifs) {
        for (sender, msgs) in notifs.iter_mut() {
            if !msgs.iter().any(|m| m.starts_with(crate::integrity::MAGIC)) {
                continue;
            }
            let mut kept = Vec::with_capacity(msgs.len());
            for m in msgs.drain(..) {
                match crate::integrity::Frame::parse(&m) {
                    None => kept.push(m),
                    Some(Ok(f))
                        if self.shared.config.verify_integrity && self.frame_matches(&f) =>
                    {
                        kept.push(f.msg)
                    }
                    Some(parsed) => {
                        tracing::error!(agent = %self.name(), remote = %sender, "notification failed its integrity check");
                        self.shared.counters.failed();
                        let msg = parsed.map(|f| f.msg).unwrap_or_default();
                        self.shared
                            .corrupt
                            .lock()
                            .push((sender.clone(), msg, false));
                    }
                }
            }
            *msgs = kept;
        }
        notifs.retain(|_, v| !v.is_empty());
    }

    fn frame_matches(&self, f: &crate::integrity::Frame) -> bool {
        // Every range must lie in this agent's own DRAM registrations before it is read; the
        // registrations found are held for the duration of the hash. A frame may not make the
        // agent hash more bytes than the regions it names hold (a real WRITE lands each byte
        // once), so a forged frame costs at most one pass over registered memory.
        let mut held = Vec::with_capacity(f.ranges.len());
        let mut regions = std::collections::HashMap::new();
        let mut total: u64 = 0;
        {
            let regs = self.shared.regs.lock();
            for &(dev, addr, len) in &f.ranges {
                match regs.find(crate::mem::MemKind::Dram, dev, addr, len) {
                    Some(r) => {
                        let size = r.0.regions[r.1].desc.len;
                        regions.insert((Arc::as_ptr(&r.0) as usize, r.1), size);
                        held.push(r);
                    }
                    None => return false,
                }
                total = total.saturating_add(len);
            }
        }
        if total > regions.values().sum::<u64>()
            || total > self.shared.config.limits.max_integrity_bytes
        {
            return false;
        }
        // SAFETY: each range lies inside a live DRAM registration held in `held`, whose memory
        // the registration keeps alive and readable.
        let hash =
            unsafe { crate::integrity::hash_ranges(f.ranges.iter().map(|&(_, a, l)| (a, l))) };
        drop(held);
        hash == f.hash
    }

    /// Takes the notifications whose integrity check failed since the last call, as
    /// `(Error::Corrupt, the user's message)`.
    pub fn take_integrity_failures(&self) -> Vec<(Error, Vec<u8>)> {
        std::mem::take(&mut *self.shared.corrupt.lock())
            .into_iter()
            .map(|(remote, msg, _)| {
                (
                    Error::Corrupt {
                        agent: self.name().to_owned(),
                        remote,
                        op: Op::GetNotifs,
                    },
                    msg,
                )
            })
            .collect()
    }

    /// Requests that ended uncertain (peer died or restarted, or deadline passed, while in
    /// flight), oldest first, up to the last 4096. A request whose `post` itself failed is not
    /// listed: that error goes straight to the caller of `post`, and the backend no longer
    /// touches the request's memory when it returns (part of a WRITE may have landed, as the
    /// error's kind says for the peer-side cases).
    pub fn uncertain_requests(&self) -> Vec<UncertainXfer> {
        self.shared.uncertain.lock().iter().cloned().collect()
    }

    /// Dropped requests whose backend has not yet released them (each still holds its
    /// memory; see [`crate::XferReq::is_draining`]). Reaped by the agent's progress.
    pub fn draining_requests(&self) -> usize {
        let _ = self.shared.reap_drained();
        self.shared.draining.lock().len()
    }

    /// Forgets the uncertain requests listed so far.
    pub fn clear_uncertain_requests(&self) {
        self.shared.uncertain.lock().clear();
    }

    /// Waits until at least one notification is queued or `timeout` passes, then drains:
    /// `Ok` with an empty map when nothing arrived in time (like [`Agent::get_notifs`], a
    /// quiet peer is not an error). Ends early with [`Error::Corrupt`] when a notification
    /// failed its integrity check; each failure ends one call (a caller that ignores the error
    /// and waits again is not woken by the same failure), and all of them stay available to
    /// [`Agent::take_integrity_failures`]. Like [`Agent::get_notifs`], reports notifications
    /// dropped since the last read first ([`Error::LimitExceeded`], whatever else is queued;
    /// the queued messages stay for the next read).
    pub fn wait_notifs(&self, timeout: Duration) -> Result<Notifs> {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.get_notifs()?;
            if !n.is_empty() {
                return Ok(n);
            }
            if let Some((remote, _, reported)) = self
                .shared
                .corrupt
                .lock()
                .iter_mut()
                .find(|(_, _, reported)| !*reported)
            {
                *reported = true;
                return Err(Error::Corrupt {
                    agent: self.name().to_owned(),
                    remote: remote.clone(),
                    op: Op::GetNotifs,
                });
            }
            if Instant::now() >= deadline {
                return Ok(n);
            }
            // Sleep on the queue: backends with their own progress deliver straight into it
            // and wake this thread. Without the agent's progress thread, come back every short
            // slice to drive the backends (`get_notifs` above) rather than spin a core.
            let slice = if self.shared.progress_running() {
                Duration::from_millis(10)
            } else {
                Duration::from_micros(50)
            };
            self.shared
                .notifs
                .wait_nonempty(deadline.min(Instant::now() + slice));
        }
    }

    /// Notifications dropped because the queue was full, per sender, since the agent was
    /// created (see [`crate::Limits::max_queued_notif_bytes`]).
    pub fn dropped_notifs(&self) -> HashMap<String, u64> {
        self.shared.notifs.dropped()
    }

    /// Sends a standalone notification to a loaded peer. A message may not start with
    /// [`RESERVED_NOTIF_PREFIX`](crate::leases::RESERVED_NOTIF_PREFIX) (`InvalidParam`): the
    /// peer's agent takes those as its own lease messages.
    #[doc(alias = "genNotif")]
    pub fn gen_notif(&self, remote: &str, msg: &[u8], hints: &[BackendHandle]) -> Result<()> {
        crate::lease::check_user_notif(self.name(), Op::GenNotif, msg)?;
        self.notify(remote, msg, hints, false)
    }

    /// [`Agent::gen_notif`] without the reserved-prefix check: `msg` goes as is, for tests that
    /// play a hostile peer (a forged or malformed lease message). Not a stable API.
    #[doc(hidden)]
    pub fn gen_notif_raw(&self, remote: &str, msg: &[u8]) -> Result<()> {
        self.notify(remote, msg, &[], false)
    }

    /// A lease control message to `remote`: posted without waiting ([`Agent::notify`]).
    pub(crate) fn post_control(&self, remote: &str, msg: &[u8]) -> Result<()> {
        self.notify(remote, msg, &[], true)
    }

    fn notify(&self, remote: &str, msg: &[u8], hints: &[BackendHandle], post: bool) -> Result<()> {
        let peer = self.remote_peer(remote, Op::GenNotif)?;
        peer.check_alive(self.name(), Op::GenNotif)?;
        let backends = self.select_backends(Op::GenNotif, hints)?;
        let slot = backends
            .iter()
            .find(|b| b.caps.notifications && peer.is_connected(b.id))
            .ok_or_else(|| {
                Error::not_supported(
                    self.name(),
                    Op::GenNotif,
                    format!("no backend with notifications reaches {remote}"),
                )
            })?;
        slot.notify(self.name(), remote, msg, post)
    }
}
