//! Who a notification comes from: connection hellos and sessions, for backends.
//!
//! A notification's sender is the peer of the connection it arrived on, never a name inside
//! the message. A backend opening a connection to a peer first sends a hello over it
//! ([`PeerAuth::hello`]): the sender's name and generation, the receiver's name, and a random
//! session id, signed with the cluster credential when authentication is on (timestamp and
//! nonce: not replayable). The receiver checks it ([`PeerAuth::check_hello`]: an accepted
//! credential, the one the sender's name is bound to, a fresh nonce) and records the session
//! with the connection it came on ([`Sessions`]). Every later notification on that connection
//! carries only the session id; the receiver attributes it to the session's sender if the
//! connection matches, and drops it (counted) otherwise.
//!
//! Without a credential each incarnation signs its hellos with a key of its own (Ed25519,
//! drawn at start, never leaving the process), whose public half its metadata announces
//! ([`HelloKeys`]). A receiver that loaded a peer counts a hello under the peer's name only when
//! it verifies under the key of the loaded incarnation; a name it did not load is held by the
//! first signed hello naming a live process of this host, until that process exits. A hello
//! under a held name that does not verify is refused (counted), and notifications on sessions
//! it did not open are not attributed. A name no one holds (a peer of an older nixl-rs, a
//! peer on another host) is still a claim (see `docs/security.md`); sessions still keep one
//! connection from speaking for another.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ed25519_dalek::SigningKey;

use super::hello_keys::read_signed;
#[cfg(test)]
use super::hello_keys::Holder;
pub use super::hello_keys::{HelloKeys, HELLO_KEY_LEN};
use crate::auth::{self, domain, Auth, Bindings, ReplayCache, Stamp, MAC_LEN};
use crate::bytes::{ByteReader, ByteWriter};
use crate::error::{DecodeError, Error, Op, Result};
use crate::liveness::ProcessId;

/// Magic of a hello.
pub const HELLO_MAGIC: &[u8; 8] = b"NXHELLO1";
/// Bytes of a session id.
pub const SESSION_LEN: usize = 16;

/// A session id: random, chosen by the connecting side.
pub type SessionId = [u8; SESSION_LEN];

/// Signs and checks hellos for one agent's backends (in
/// [`crate::backend::BackendContext::peers`]).
#[derive(Clone)]
pub struct PeerAuth {
    inner: Arc<Inner>,
}

struct Inner {
    me: String,
    generation: u64,
    auth: Option<Auth>,
    bindings: Arc<Bindings>,
    replay: Arc<ReplayCache>,
    keys: Arc<HelloKeys>,
}

impl std::fmt::Debug for PeerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerAuth")
            .field("agent", &self.inner.me)
            .field("authenticated", &self.inner.auth.is_some())
            .finish()
    }
}

/// A checked hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The sender's agent name.
    pub sender: String,
    /// The sender's generation.
    pub generation: u64,
    /// The session its notifications will carry.
    pub session: SessionId,
    /// Whether it was verified under a credential (false: authentication is off here).
    pub authenticated: bool,
    /// Without a credential: the hello key it was signed with (`None`: unsigned, a claim).
    pub key: Option<[u8; HELLO_KEY_LEN]>,
}

impl PeerAuth {
    pub(crate) fn new(
        me: &str,
        generation: u64,
        auth: Option<Auth>,
        bindings: Arc<Bindings>,
        replay: Arc<ReplayCache>,
        keys: Arc<HelloKeys>,
    ) -> Self {
        PeerAuth {
            inner: Arc::new(Inner {
                me: me.to_owned(),
                generation,
                auth,
                bindings,
                replay,
                keys,
            }),
        }
    }

    /// For a backend used outside an agent (unit tests): no credential, no bindings, a fresh
    /// hello key.
    pub fn unauthenticated(me: &str) -> Self {
        let keys = HelloKeys::generate(ProcessId::current(), 1 << 16)
            .or_else(|_| HelloKeys::generate(None, 1 << 16))
            .map(Arc::new)
            .unwrap_or_else(|_| {
                // No randomness at all: a fixed key still signs (nothing trusts it).
                Arc::new(HelloKeys {
                    key: SigningKey::from_bytes(&[7; 32]),
                    process: None,
                    names: Mutex::new(HashMap::new()),
                    max_names: 1,
                    refused: AtomicU64::new(0),
                    loaded_only: std::sync::atomic::AtomicBool::new(false),
                })
            });
        PeerAuth::new(
            me,
            1,
            None,
            Arc::new(Bindings::default()),
            Arc::new(ReplayCache::default()),
            keys,
        )
    }

    /// The agent's hello keys.
    pub fn keys(&self) -> &Arc<HelloKeys> {
        &self.inner.keys
    }

    /// The sender of a notification carrying `session` that arrived on `conn` (as
    /// [`Sessions::sender`]), if its session's hello still counts under the key that holds
    /// the sender's name now; `None` (and counted) otherwise.
    pub fn attribute(&self, sessions: &Sessions, session: &SessionId, conn: u64) -> Option<String> {
        let (name, key) = sessions.sender_and_key(session, conn)?;
        if self.inner.auth.is_some() || self.inner.keys.counts(&name, key.as_ref()) {
            return Some(name);
        }
        sessions.unattributed.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// The agent's name.
    pub fn agent(&self) -> &str {
        &self.inner.me
    }

    /// Whether hellos are signed and verified.
    pub fn is_authenticated(&self) -> bool {
        self.inner.auth.is_some()
    }

    /// A fresh random session id.
    pub fn new_session(&self) -> Result<SessionId> {
        auth::random()
    }

    /// The hello this agent sends on a new connection to `receiver`.
    pub fn hello(&self, receiver: &str, session: &SessionId) -> Result<Vec<u8>> {
        let i = &self.inner;
        let mut w = ByteWriter::with_capacity(128 + i.me.len() + receiver.len());
        w.put(HELLO_MAGIC).put_str(&i.me).put_u64(i.generation);
        w.put_str(receiver).put(session);
        match &i.auth {
            None => {
                w.put_bool(false);
                i.keys.sign(&mut w);
            }
            Some(a) => {
                w.put_bool(true);
                Stamp::fresh(&a.credential)?.write(&mut w);
                let tag = auth::mac(&a.credential, domain::HELLO, w.as_slice());
                w.put(&tag);
            }
        }
        Ok(w.into_vec())
    }

    /// Checks a hello that arrived on a connection of this agent.
    pub fn check_hello(&self, bytes: &[u8]) -> Result<Hello> {
        let i = &self.inner;
        let refuse = |why: String| Error::not_allowed(&i.me, Op::GetNotifs, why);
        let decode = |source: DecodeError| Error::Decode {
            agent: i.me.clone(),
            op: Op::GetNotifs,
            source,
        };
        let mut r = ByteReader::new(bytes);
        r.magic(HELLO_MAGIC).map_err(decode)?;
        let sender = r
            .str("hello sender", crate::codec::MAX_NAME)
            .map_err(decode)?
            .to_owned();
        let generation = r.u64().map_err(decode)?;
        let receiver = r
            .str("hello receiver", crate::codec::MAX_NAME)
            .map_err(decode)?;
        let session: SessionId = r.array().map_err(decode)?;
        let signed = r.bool("hello auth flag").map_err(decode)?;
        if sender.is_empty() {
            return Err(decode(DecodeError::Invalid {
                what: "hello sender",
            }));
        }
        if receiver != i.me {
            return Err(refuse(format!("a hello for {receiver} reached {}", i.me)));
        }
        let Some(a) = &i.auth else {
            // Unauthenticated here: signed with the sender's hello key (an older sender's
            // unsigned hello, or a signed one's stamp and MAC, ends here).
            let signed = if !signed && r.remaining() > 0 {
                let s = read_signed(bytes, &mut r).map_err(decode)?;
                r.finish().map_err(decode)?;
                Some(s)
            } else {
                None
            };
            let key = i.keys.admit(&sender, signed).map_err(refuse)?;
            return Ok(Hello {
                sender,
                generation,
                session,
                authenticated: false,
                key,
            });
        };
        if !signed {
            return Err(refuse(format!(
                "an unauthenticated hello claiming to be {sender}"
            )));
        }
        let stamp = Stamp::read(&mut r).map_err(decode)?;
        let signed_len = r.position();
        let tag = r.take(MAC_LEN).map_err(decode)?;
        r.finish().map_err(decode)?;
        let cred = a
            .find(&stamp.credential)
            .ok_or_else(|| refuse(format!("a hello from {sender} under an unknown credential")))?;
        if !auth::verify(cred, domain::HELLO, &bytes[..signed_len], tag) {
            return Err(refuse(format!(
                "a hello claiming to be {sender} failed authentication"
            )));
        }
        if i.bindings
            .credential_of(&sender)
            .is_some_and(|c| c != cred.id())
        {
            return Err(refuse(format!(
                "a hello from {sender} under credential {:?}, which that name is not bound to",
                cred.id()
            )));
        }
        i.replay
            .check(stamp.ts_ms, &stamp.nonce, a.max_clock_skew)
            .map_err(|why| refuse(format!("a hello from {sender}: {why}")))?;
        Ok(Hello {
            sender,
            generation,
            session,
            authenticated: true,
            key: None,
        })
    }
}

/// The sessions a backend accepted: session id to sender, with the connection each came on.
///
/// Bounded ([`Sessions::capacity`]) without ever forgetting another peer's session: a sender
/// that reconnects replaces its own oldest session when the table is full (or when it holds
/// [`MAX_SESSIONS_PER_SENDER`]), and a newcomer that would need someone else's room is refused
/// (its notifications are then dropped and counted, as from an unknown connection). A flood of
/// hellos from strangers therefore cannot make an honest peer's notifications disappear.
#[derive(Debug)]
pub struct Sessions {
    inner: Mutex<SessionsInner>,
    capacity: usize,
    unattributed: AtomicU64,
    refused: AtomicU64,
}

/// The most sessions one sender holds at once (its connections, one per worker or rail, and
/// their replacements); past it, its oldest is forgotten.
pub const MAX_SESSIONS_PER_SENDER: usize = 256;

#[derive(Debug, Default)]
struct SessionsInner {
    /// Session -> (sender, connection, the hello key its hello was signed with).
    by_id: HashMap<SessionId, (String, u64, Option<[u8; HELLO_KEY_LEN]>)>,
    /// Per sender, its sessions, oldest first.
    by_sender: HashMap<String, VecDeque<SessionId>>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::with_capacity(1 << 14)
    }
}

impl Sessions {
    /// A table of at most `capacity` sessions.
    pub fn with_capacity(capacity: usize) -> Self {
        Sessions {
            inner: Mutex::new(SessionsInner::default()),
            capacity: capacity.max(1),
            unattributed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// The most sessions kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records a checked hello that arrived on connection `conn` (a backend's token for the
    /// connection, e.g. its endpoint handle). Refused (and counted) when the table is full and
    /// the sender has no session of its own to give up.
    pub fn accept(&self, hello: &Hello, conn: u64) -> std::result::Result<(), &'static str> {
        let mut g = self.inner.lock();
        let g = &mut *g;
        if let Some(slot) = g.by_id.get_mut(&hello.session) {
            if slot.0 == hello.sender && slot.2 == hello.key {
                slot.1 = conn;
                return Ok(());
            }
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err("the session id belongs to another sender");
        }
        let own = g.by_sender.entry(hello.sender.clone()).or_default();
        if own.len() >= MAX_SESSIONS_PER_SENDER
            || (g.by_id.len() >= self.capacity && !own.is_empty())
        {
            if let Some(old) = own.pop_front() {
                g.by_id.remove(&old);
            }
        }
        if g.by_id.len() >= self.capacity {
            if own.is_empty() {
                g.by_sender.remove(&hello.sender);
            }
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err("the session table is full");
        }
        own.push_back(hello.session);
        g.by_id
            .insert(hello.session, (hello.sender.clone(), conn, hello.key));
        Ok(())
    }

    /// Hellos refused because the table was full (or named a session of another sender).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The sender of a notification carrying `session` that arrived on `conn`; `None` (and
    /// counted) for an unknown session or one that belongs to another connection.
    ///
    /// Without a credential, use [`PeerAuth::attribute`]: it also checks that the session's
    /// hello key still holds the sender's name.
    pub fn sender(&self, session: &SessionId, conn: u64) -> Option<String> {
        self.sender_and_key(session, conn).map(|(name, _)| name)
    }

    /// [`Sessions::sender`] with the hello key the session's hello was signed with.
    fn sender_and_key(
        &self,
        session: &SessionId,
        conn: u64,
    ) -> Option<(String, Option<[u8; HELLO_KEY_LEN]>)> {
        let found = self
            .inner
            .lock()
            .by_id
            .get(session)
            .filter(|(_, c, _)| *c == conn)
            .map(|(name, _, key)| (name.clone(), *key));
        if found.is_none() {
            self.unattributed.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Notifications dropped because their session or connection was unknown.
    pub fn unattributed(&self) -> u64 {
        self.unattributed.load(Ordering::Relaxed)
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        self.inner.lock().by_id.len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Credential;

    fn peer(me: &str, cred: Option<&Credential>) -> PeerAuth {
        PeerAuth::new(
            me,
            7,
            cred.map(|c| Auth::new(c.clone())),
            Arc::new(Bindings::default()),
            Arc::new(ReplayCache::default()),
            Arc::new(HelloKeys::generate(ProcessId::current(), 64).unwrap()),
        )
    }

    #[test]
    fn signed_hellos_verify_once_for_their_receiver() {
        let cred = Credential::generate("c").unwrap();
        let (a, b) = (peer("a", Some(&cred)), peer("b", Some(&cred)));
        let s = a.new_session().unwrap();
        let h = a.hello("b", &s).unwrap();
        let got = b.check_hello(&h).unwrap();
        assert_eq!(
            (
                got.sender.as_str(),
                got.generation,
                got.session,
                got.authenticated
            ),
            ("a", 7, s, true)
        );
        assert!(b.check_hello(&h).is_err(), "replayed");
        assert!(
            peer("c", Some(&cred))
                .check_hello(&a.hello("b", &s).unwrap())
                .is_err(),
            "other receiver"
        );
        // Forged: another secret, unsigned, or any byte changed.
        let mallory = peer("a", Some(&Credential::generate("c").unwrap()));
        assert!(b.check_hello(&mallory.hello("b", &s).unwrap()).is_err());
        assert!(b
            .check_hello(&peer("a", None).hello("b", &s).unwrap())
            .is_err());
        let h = a.hello("b", &s).unwrap();
        for i in 0..h.len() {
            let mut m = h.clone();
            m[i] ^= 4;
            assert!(b.check_hello(&m).is_err(), "byte {i}");
        }
        // Without a credential the receiver takes the claim.
        assert!(
            !peer("b", None)
                .check_hello(&peer("x", None).hello("b", &s).unwrap())
                .unwrap()
                .authenticated
        );
    }

    #[test]
    fn sessions_attribute_only_on_their_connection_and_stay_bounded() {
        let t = Sessions::with_capacity(2);
        let hello = |n: &str, s: u8| Hello {
            sender: n.into(),
            generation: 1,
            session: [s; SESSION_LEN],
            authenticated: true,
            key: None,
        };
        t.accept(&hello("a", 1), 10).unwrap();
        assert_eq!(t.sender(&[1; SESSION_LEN], 10).as_deref(), Some("a"));
        assert_eq!(t.sender(&[1; SESSION_LEN], 11), None, "another connection");
        assert_eq!(t.sender(&[2; SESSION_LEN], 10), None, "unknown session");
        t.accept(&hello("b", 2), 11).unwrap();
        assert!(
            t.accept(&hello("c", 3), 12).is_err(),
            "full: the newcomer is refused"
        );
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.sender(&[1; SESSION_LEN], 10).as_deref(),
            Some("a"),
            "kept"
        );
        // A sender that reconnects replaces its own oldest session.
        t.accept(&hello("a", 4), 13).unwrap();
        assert_eq!(t.sender(&[1; SESSION_LEN], 10), None, "its own old session");
        assert_eq!(t.sender(&[4; SESSION_LEN], 13).as_deref(), Some("a"));
        assert_eq!(
            t.sender(&[2; SESSION_LEN], 11).as_deref(),
            Some("b"),
            "b's stays"
        );
        assert_eq!(t.unattributed(), 3);
        assert_eq!(t.refused(), 1);
    }

    /// A process of this host that has exited (its start time cannot match).
    fn gone_process() -> ProcessId {
        ProcessId {
            start_time: u64::MAX,
            ..ProcessId::current().unwrap()
        }
    }

    #[test]
    fn a_loaded_name_counts_only_hellos_signed_with_its_key() {
        let (b, a, mallory) = (peer("b", None), peer("a", None), peer("a", None));
        let s = a.new_session().unwrap();
        b.keys()
            .loaded("a", Some(a.keys().public()), ProcessId::current());
        let got = b.check_hello(&a.hello("b", &s).unwrap()).unwrap();
        assert_eq!(got.key, Some(a.keys().public()));
        // Another process claiming the name, with its own key: refused.
        let e = b.check_hello(&mallory.hello("b", &s).unwrap()).unwrap_err();
        assert!(matches!(e, Error::NotAllowed { .. }), "{e}");
        // Without the signature (an older peer's form): refused under a held name.
        let mut unsigned = ByteWriter::new();
        unsigned
            .put(HELLO_MAGIC)
            .put_str("a")
            .put_u64(7)
            .put_str("b")
            .put(&s)
            .put_bool(false);
        assert!(b.check_hello(unsigned.as_slice()).is_err());
        assert_eq!(b.keys().refused(), 2);
        // A damaged signature is refused as such.
        let mut h = a.hello("b", &s).unwrap();
        let n = h.len();
        h[n - 1] ^= 1;
        assert!(b.check_hello(&h).is_err());
        // Once forgotten, the name is free: the unsigned claim counts (nothing holds it).
        b.keys().forgotten("a");
        assert_eq!(b.check_hello(unsigned.as_slice()).unwrap().key, None);
        // A loaded peer that announced no key (an older nixl-rs) keeps the old rule.
        b.keys().loaded("old", None, None);
        let mut old = ByteWriter::new();
        old.put(HELLO_MAGIC)
            .put_str("old")
            .put_u64(1)
            .put_str("b")
            .put(&s)
            .put_bool(false);
        assert!(b.check_hello(old.as_slice()).is_ok());
    }

    #[test]
    fn a_name_not_loaded_is_held_by_its_first_signed_hello_until_its_process_exits() {
        let b = peer("b", None);
        let (d, mallory) = (peer("d", None), peer("d", None));
        let s = d.new_session().unwrap();
        b.check_hello(&d.hello("b", &s).unwrap()).unwrap();
        let e = b.check_hello(&mallory.hello("b", &s).unwrap()).unwrap_err();
        assert!(matches!(e, Error::NotAllowed { .. }), "{e}");
        // Sessions: mallory's could not open; d's counts.
        let sessions = Sessions::default();
        let hd = b.check_hello(&d.hello("b", &s).unwrap()).unwrap();
        sessions.accept(&hd, 1).unwrap();
        assert_eq!(b.attribute(&sessions, &s, 1).as_deref(), Some("d"));
        // Loading d's metadata with another key (its real incarnation, say) ends the
        // sessions the first key opened.
        b.keys()
            .loaded("d", Some(mallory.keys().public()), ProcessId::current());
        assert_eq!(b.attribute(&sessions, &s, 1), None);
        // A holder whose process exited gives the name up to the next signed hello.
        let c = peer("c", None);
        b.keys().names.lock().insert(
            "c".into(),
            Holder::First {
                key: [1; 32],
                process: gone_process(),
            },
        );
        let got = b.check_hello(&c.hello("b", &s).unwrap()).unwrap();
        assert_eq!(got.key, Some(c.keys().public()));
        assert!(
            matches!(b.keys().names.lock().get("c"), Some(Holder::First { key, .. }) if *key == c.keys().public())
        );
    }

    #[test]
    fn with_loaded_senders_only_nothing_counts_until_the_sender_is_loaded() {
        let b = peer("b", None);
        b.keys().set_loaded_only(true);
        let (d, mallory) = (peer("d", None), peer("d", None));
        let s = d.new_session().unwrap();
        let m = mallory.new_session().unwrap();
        let sessions = Sessions::default();
        // Both hellos open sessions (the sender's metadata may be loaded right after), and no
        // name is bound by them.
        sessions
            .accept(&b.check_hello(&d.hello("b", &s).unwrap()).unwrap(), 1)
            .unwrap();
        sessions
            .accept(&b.check_hello(&mallory.hello("b", &m).unwrap()).unwrap(), 2)
            .unwrap();
        assert_eq!(b.attribute(&sessions, &s, 1), None, "not loaded yet");
        assert_eq!(b.keys().refused(), 1);
        // Loaded with d's key: d's session counts, the other process's never does.
        b.keys()
            .loaded("d", Some(d.keys().public()), ProcessId::current());
        assert_eq!(b.attribute(&sessions, &s, 1).as_deref(), Some("d"));
        assert_eq!(b.attribute(&sessions, &m, 2), None);
        assert_eq!(b.keys().refused(), 2);
    }
}
