//! Authenticated peers: a cluster credential (a shared secret) and what it signs.
//!
//! An agent configured with [`Auth`] signs, with HMAC-SHA256 under its [`Credential`]:
//!
//! - its metadata: [`Agent::local_metadata`](crate::Agent::local_metadata) returns the blob
//!   inside an envelope (credential id, issue time, the owner commitment, the blob, the MAC),
//!   wherever it travels (the side channel, etcd, the application's own handshake);
//! - every side-channel frame, with a timestamp and a nonce (replay window, see
//!   [`crate::sidechannel`]);
//! - every backend connection's hello (the peer a notification comes from, see
//!   [`crate::backend::PeerAuth`]).
//!
//! It accepts only what verifies under its own credential or one of [`Auth::trusted`], binds a
//! peer's name to the credential that first loaded it (a new generation under that name needs
//! the same credential and a later issue time), and lets only the owner invalidate it (the
//! INVALIDATE frame reveals the secret whose hash the owner's metadata committed to). The trust
//! model is in `docs/security.md`.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::bytes::{ByteReader, ByteWriter};
use crate::error::{DecodeError, Error, Op, Result};

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a MAC.
pub const MAC_LEN: usize = 32;
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Longest credential id.
pub const MAX_CREDENTIAL_ID: usize = 64;
/// Shortest accepted secret.
pub const MIN_SECRET: usize = 16;
/// Longest accepted secret.
pub const MAX_SECRET: usize = 1024;
/// The environment variable [`Credential::from_env`] reads (`id:hex-secret`).
pub const ENV_CREDENTIAL: &str = "NIXL_CREDENTIAL";
/// Magic of a sealed metadata envelope.
pub const ENVELOPE_MAGIC: &[u8; 8] = b"NXRSAUTH";
const ENVELOPE_VERSION: u16 = 1;

/// MAC domains: a MAC made for one purpose never verifies for another.
pub(crate) mod domain {
    pub(crate) const METADATA: &[u8] = b"nixl-rs/metadata/1\0";
    pub(crate) const REQUEST: &[u8] = b"nixl-rs/side-channel/request/1\0";
    pub(crate) const REPLY: &[u8] = b"nixl-rs/side-channel/reply/1\0";
    pub(crate) const HELLO: &[u8] = b"nixl-rs/hello/1\0";
    pub(crate) const OWNER: &[u8] = b"nixl-rs/owner/1\0";
}

/// A cluster credential: an id (named in everything it signs) and a secret.
///
/// Agents holding the same credential are one trust domain: each can sign as any name bound
/// to it. `Debug` shows the id only.
#[derive(Clone)]
pub struct Credential {
    id: Arc<str>,
    secret: Arc<[u8]>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn cred_error(reason: impl Into<String>) -> Error {
    Error::invalid("", Op::CreateBackend, reason)
}

fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MAX_CREDENTIAL_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(cred_error(format!(
            "credential id must be 1..={MAX_CREDENTIAL_ID} bytes of [A-Za-z0-9._-]"
        )))
    }
}

impl Credential {
    /// The environment variable [`Credential::from_env`] reads (`NIXL_CREDENTIAL`).
    pub const ENV: &'static str = ENV_CREDENTIAL;

    /// A credential from an id and a secret of [`MIN_SECRET`]..=[`MAX_SECRET`] bytes.
    pub fn new(id: &str, secret: &[u8]) -> Result<Self> {
        check_id(id)?;
        if !(MIN_SECRET..=MAX_SECRET).contains(&secret.len()) {
            return Err(cred_error(format!(
                "a credential secret must be {MIN_SECRET}..={MAX_SECRET} bytes (got {})",
                secret.len()
            )));
        }
        Ok(Credential {
            id: Arc::from(id),
            secret: Arc::from(secret),
        })
    }

    /// A credential with a fresh random 32-byte secret (hand it to peers with
    /// [`Credential::export`]).
    pub fn generate(id: &str) -> Result<Self> {
        Credential::new(id, &random::<32>()?)
    }

    /// Parses `id:hex-secret` (what [`Credential::export`] writes).
    pub fn parse(s: &str) -> Result<Self> {
        let (id, hex) = s
            .trim()
            .split_once(':')
            .ok_or_else(|| cred_error("a credential is written `id:hex-secret`"))?;
        let secret = decode_hex(hex).ok_or_else(|| cred_error("credential secret is not hex"))?;
        Credential::new(id, &secret)
    }

    /// The credential in [`ENV_CREDENTIAL`] (`id:hex-secret`).
    pub fn from_env() -> Result<Self> {
        let v = std::env::var(ENV_CREDENTIAL)
            .map_err(|_| cred_error(format!("{ENV_CREDENTIAL} is not set")))?;
        Credential::parse(&v)
    }

    /// The credential in a file (`id:hex-secret`, surrounding whitespace ignored).
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let s = std::fs::read_to_string(path).map_err(|e| Error::io("", Op::CreateBackend, e))?;
        Credential::parse(&s)
    }

    /// `id:hex-secret`: the secret in clear, for provisioning peers (store it like a key).
    pub fn export(&self) -> String {
        let hex: String = self.secret.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{hex}", self.id)
    }

    /// The id.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn mac(&self, domain: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
        // HMAC takes keys of any length; a failure here is impossible, and would yield a tag
        // that never verifies.
        let Ok(mut m) = <HmacSha256 as Mac>::new_from_slice(&self.secret) else {
            return [0; MAC_LEN];
        };
        m.update(domain);
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    fn verify(&self, domain: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        let Ok(mut m) = <HmacSha256 as Mac>::new_from_slice(&self.secret) else {
            return false;
        };
        m.update(domain);
        for p in parts {
            m.update(p);
        }
        m.verify_slice(tag).is_ok()
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `N` random bytes from the kernel.
pub(crate) fn random<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    let mut filled = 0;
    while filled < N {
        let n = rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty())
            .map_err(|e| Error::io("", Op::CreateBackend, e.into()))?;
        filled += n;
    }
    Ok(b)
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How an agent authenticates peers (set [`crate::AgentConfig::auth`]).
#[derive(Clone, Debug)]
pub struct Auth {
    /// What this agent signs with (and accepts).
    pub credential: Credential,
    /// Other credentials whose holders this agent accepts (a second domain, or the next key
    /// during a rotation).
    pub trusted: Vec<Credential>,
    /// How far a side-channel frame's or hello's timestamp may be from this host's clock
    /// (frames outside are refused; inside, each nonce is accepted once).
    pub max_clock_skew: Duration,
}

impl Auth {
    /// Authenticates with `credential` and accepts only it.
    pub fn new(credential: Credential) -> Self {
        Auth {
            credential,
            trusted: Vec::new(),
            max_clock_skew: Duration::from_secs(60),
        }
    }

    /// The credential with this id, if accepted.
    pub(crate) fn find(&self, id: &str) -> Option<&Credential> {
        std::iter::once(&self.credential)
            .chain(&self.trusted)
            .find(|c| &*c.id == id)
    }
}

/// Nonces seen within the replay window (bounded: a full cache refuses new frames).
#[derive(Debug, Default)]
pub(crate) struct ReplayCache {
    inner: Mutex<ReplayInner>,
}

#[derive(Debug, Default)]
struct ReplayInner {
    seen: HashMap<[u8; NONCE_LEN], u64>,
    order: VecDeque<([u8; NONCE_LEN], u64)>,
}

/// Most nonces remembered at once.
pub(crate) const MAX_NONCES: usize = 1 << 16;

impl ReplayCache {
    /// Accepts `nonce` at `ts_ms` once: refuses a timestamp outside `skew` of now, a nonce
    /// seen before within the window, and (when full) anything new.
    pub(crate) fn check(
        &self,
        ts_ms: u64,
        nonce: &[u8; NONCE_LEN],
        skew: Duration,
    ) -> Result<(), &'static str> {
        let now = now_ms();
        let skew_ms = skew.as_millis() as u64;
        if ts_ms.abs_diff(now) > skew_ms {
            return Err("timestamp outside the replay window (clocks differ or the frame is old)");
        }
        let mut g = self.inner.lock();
        while let Some(&(n, exp)) = g.order.front() {
            if exp > now {
                break;
            }
            g.order.pop_front();
            g.seen.remove(&n);
        }
        if g.seen.contains_key(nonce) {
            return Err("replayed nonce");
        }
        if g.seen.len() >= MAX_NONCES {
            return Err("too many authenticated frames within the replay window");
        }
        // A frame is fresh until ts + skew; remember it at least that long.
        let exp = ts_ms.saturating_add(skew_ms).max(now) + 1;
        g.seen.insert(*nonce, exp);
        g.order.push_back((*nonce, exp));
        Ok(())
    }
}

/// What a verified envelope proves about metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proof {
    /// The credential it verified under.
    pub credential: String,
    /// When its owner sealed it (ms since the epoch; increases per agent).
    pub issued_ms: u64,
    /// The owner's commitment (SHA-256 of its secret owner token).
    pub owner_commit: [u8; 32],
}

/// Metadata opened from bytes: the blob and, when the envelope verified, its proof.
pub(crate) struct Opened<'a> {
    pub blob: &'a [u8],
    pub proof: Option<Proof>,
}

/// The parts of an envelope.
struct Envelope<'a> {
    cred: &'a str,
    issued_ms: u64,
    commit: [u8; 32],
    blob: &'a [u8],
    signed: &'a [u8],
    mac: &'a [u8],
}

fn parse_envelope(bytes: &[u8]) -> Result<Envelope<'_>, DecodeError> {
    let mut r = ByteReader::new(bytes);
    r.magic(ENVELOPE_MAGIC)?;
    let v = r.u16()?;
    if v != ENVELOPE_VERSION {
        return Err(DecodeError::UnsupportedVersion(v));
    }
    let cred = r.str("credential id", MAX_CREDENTIAL_ID)?;
    let issued_ms = r.u64()?;
    let commit = r.array::<32>()?;
    let blob = r.blob("sealed metadata", crate::codec::MAX_METADATA)?;
    let signed_len = r.position();
    let mac = r.take(MAC_LEN)?;
    r.finish()?;
    Ok(Envelope {
        cred,
        issued_ms,
        commit,
        blob,
        signed: &bytes[..signed_len],
        mac,
    })
}

/// Whether bytes are a sealed envelope (by their magic).
pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.starts_with(ENVELOPE_MAGIC)
}

/// The metadata blob inside `bytes` (sealed or not), without verifying anything: for code
/// that only reads names and generations (the etcd watcher) before the agent verifies.
pub fn unsealed(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    if is_sealed(bytes) {
        parse_envelope(bytes).map(|e| e.blob)
    } else {
        Ok(bytes)
    }
}

/// The agent's signing state: its credential set, owner token and issue clock.
pub(crate) struct Signer {
    pub auth: Option<Auth>,
    owner_token: [u8; 32],
    owner_commit: [u8; 32],
    last_issued: AtomicU64,
    pub replay: Arc<ReplayCache>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

/// The commitment to an owner token.
pub(crate) fn commit(token: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(domain::OWNER);
    h.update(token);
    h.finalize().into()
}

impl Signer {
    pub(crate) fn new(auth: Option<Auth>) -> Result<Self> {
        let owner_token = random::<32>()?;
        Ok(Signer {
            auth,
            owner_commit: commit(&owner_token),
            owner_token,
            last_issued: AtomicU64::new(0),
            replay: Arc::new(ReplayCache::default()),
        })
    }

    /// The secret whose commitment this agent's sealed metadata carries.
    pub(crate) fn owner_token(&self) -> &[u8; 32] {
        &self.owner_token
    }

    /// An issue time later than every earlier one of this agent.
    fn issue_time(&self) -> u64 {
        let now = now_ms();
        let mut prev = self.last_issued.load(Ordering::Relaxed);
        loop {
            let next = now.max(prev + 1);
            match self
                .last_issued
                .compare_exchange(prev, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(p) => prev = p,
            }
        }
    }

    /// Seals a metadata blob when authentication is on (the blob unchanged otherwise).
    pub(crate) fn seal(&self, blob: Vec<u8>) -> Vec<u8> {
        let Some(auth) = &self.auth else { return blob };
        let cred = &auth.credential;
        let mut w = ByteWriter::with_capacity(blob.len() + 128);
        w.put(ENVELOPE_MAGIC).put_u16(ENVELOPE_VERSION);
        w.put_str(cred.id()).put_u64(self.issue_time());
        w.put(&self.owner_commit).put_blob(&blob);
        let mac = cred.mac(domain::METADATA, &[w.as_slice()]);
        w.put(&mac);
        w.into_vec()
    }

    /// Opens metadata bytes. With authentication on, only a sealed blob that verifies under
    /// an accepted credential opens (`NotAllowed` otherwise); with it off, the envelope (if
    /// any) is removed unverified.
    pub(crate) fn open<'a>(&self, agent: &str, bytes: &'a [u8]) -> Result<Opened<'a>> {
        let decode = |source| Error::Decode {
            agent: agent.to_owned(),
            op: Op::LoadMetadata,
            source,
        };
        let Some(auth) = &self.auth else {
            return Ok(Opened {
                blob: unsealed(bytes).map_err(decode)?,
                proof: None,
            });
        };
        if !is_sealed(bytes) {
            return Err(Error::not_allowed(
                agent,
                Op::LoadMetadata,
                "metadata is not authenticated (this agent requires a credential)",
            ));
        }
        let e = parse_envelope(bytes).map_err(decode)?;
        let cred = auth.find(e.cred).ok_or_else(|| {
            Error::not_allowed(
                agent,
                Op::LoadMetadata,
                format!(
                    "metadata signed with credential {:?}, which this agent does not accept",
                    e.cred
                ),
            )
        })?;
        if !cred.verify(domain::METADATA, &[e.signed], e.mac) {
            return Err(Error::not_allowed(
                agent,
                Op::LoadMetadata,
                "metadata failed authentication (forged, damaged, or signed with another secret)",
            ));
        }
        Ok(Opened {
            blob: e.blob,
            proof: Some(Proof {
                credential: cred.id().to_owned(),
                issued_ms: e.issued_ms,
                owner_commit: e.commit,
            }),
        })
    }
}

/// Which credential a name belongs to, and the newest metadata accepted under it.
#[derive(Debug, Clone)]
pub(crate) struct NameBinding {
    pub credential: String,
    pub last_issued_ms: u64,
}

/// Names bound to credentials (bounded: see [`crate::Limits::max_known_names`]).
#[derive(Debug, Default)]
pub(crate) struct Bindings {
    pub names: Mutex<HashMap<String, NameBinding>>,
}

impl Bindings {
    /// Checks that `proof` may load metadata of `name` (`new_incarnation`: a generation not
    /// loaded now). Changes nothing.
    pub(crate) fn check(
        &self,
        agent: &str,
        name: &str,
        proof: &Proof,
        new_incarnation: bool,
        limit: usize,
    ) -> Result<()> {
        let names = self.names.lock();
        match names.get(name) {
            Some(b) if b.credential != proof.credential => Err(Error::not_allowed(
                agent,
                Op::LoadMetadata,
                format!(
                    "agent name {name} belongs to credential {:?}, not {:?}",
                    b.credential, proof.credential
                ),
            )),
            Some(b) if new_incarnation && proof.issued_ms <= b.last_issued_ms => {
                Err(Error::not_allowed(
                    agent,
                    Op::LoadMetadata,
                    format!("metadata of {name} is older than what was accepted before (a replay)"),
                ))
            }
            Some(_) => Ok(()),
            None if names.len() >= limit => Err(Error::LimitExceeded {
                agent: agent.to_owned(),
                op: Op::LoadMetadata,
                what: "known agent names".into(),
                limit: limit as u64,
            }),
            None => Ok(()),
        }
    }

    /// Records an accepted load.
    pub(crate) fn record(&self, name: &str, proof: &Proof) {
        let mut names = self.names.lock();
        let b = names.entry(name.to_owned()).or_insert_with(|| NameBinding {
            credential: proof.credential.clone(),
            last_issued_ms: 0,
        });
        b.last_issued_ms = b.last_issued_ms.max(proof.issued_ms);
    }

    /// The credential `name` is bound to.
    pub(crate) fn credential_of(&self, name: &str) -> Option<String> {
        self.names.lock().get(name).map(|b| b.credential.clone())
    }
}

/// A signed frame header: credential id, timestamp, nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub credential: String,
    pub ts_ms: u64,
    pub nonce: [u8; NONCE_LEN],
}

impl Stamp {
    pub(crate) fn fresh(cred: &Credential) -> Result<Self> {
        Ok(Stamp {
            credential: cred.id().to_owned(),
            ts_ms: now_ms(),
            nonce: random()?,
        })
    }

    pub(crate) fn write(&self, w: &mut ByteWriter) {
        w.put_str(&self.credential)
            .put_u64(self.ts_ms)
            .put(&self.nonce);
    }

    pub(crate) fn read(r: &mut ByteReader<'_>) -> Result<Self, DecodeError> {
        Ok(Stamp {
            credential: r.str("credential id", MAX_CREDENTIAL_ID)?.to_owned(),
            ts_ms: r.u64()?,
            nonce: r.array()?,
        })
    }
}

/// MACs `signed` under `cred` in `domain`.
pub(crate) fn mac(cred: &Credential, domain: &[u8], signed: &[u8]) -> [u8; MAC_LEN] {
    cred.mac(domain, &[signed])
}

/// Verifies a MAC made by [`mac`].
pub(crate) fn verify(cred: &Credential, domain: &[u8], signed: &[u8], tag: &[u8]) -> bool {
    cred.verify(domain, &[signed], tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(id: &str) -> Signer {
        Signer::new(Some(Auth::new(Credential::generate(id).unwrap()))).unwrap()
    }

    #[test]
    fn credentials_parse_and_refuse_weak_secrets() {
        let c = Credential::generate("cluster-a").unwrap();
        let back = Credential::parse(&c.export()).unwrap();
        assert_eq!(back.id(), "cluster-a");
        assert_eq!(back.export(), c.export());
        assert!(!format!("{c:?}").contains(&c.export()[10..]));
        assert!(Credential::new("a", b"short").is_err());
        assert!(Credential::new("", &[0; 32]).is_err());
        assert!(Credential::new("bad id", &[0; 32]).is_err());
        assert!(Credential::parse("nocolon").is_err());
        assert!(Credential::parse("a:zz").is_err());
    }

    #[test]
    fn sealed_metadata_verifies_only_under_its_credential() {
        let s = signer("a");
        let sealed = s.seal(b"blob".to_vec());
        let o = s.open("me", &sealed).unwrap();
        assert_eq!(o.blob, b"blob");
        let proof = o.proof.unwrap();
        assert_eq!(proof.credential, "a");
        // Another secret under the same id, or another id: refused.
        let other = signer("a");
        assert_eq!(
            other.open("me", &sealed).err().map(|e| e.kind()),
            Some(crate::ErrorKind::NotAllowed)
        );
        let third = signer("b");
        assert!(third.open("me", &sealed).is_err());
        // Unsealed bytes are refused with auth on, accepted with it off.
        assert!(s.open("me", b"blob").is_err());
        let off = Signer::new(None).unwrap();
        assert_eq!(off.open("me", b"blob").unwrap().blob, b"blob");
        assert_eq!(off.open("me", &sealed).unwrap().blob, b"blob");
        // Every single-byte change is refused.
        for i in 0..sealed.len() {
            let mut m = sealed.clone();
            m[i] ^= 0x20;
            assert!(s.open("me", &m).is_err(), "byte {i}");
        }
    }

    #[test]
    fn issue_times_increase() {
        let s = signer("a");
        let t: Vec<u64> = (0..100)
            .map(|_| {
                let b = s.seal(vec![1]);
                s.open("me", &b).unwrap().proof.unwrap().issued_ms
            })
            .collect();
        assert!(t.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn replay_cache_refuses_repeats_old_frames_and_overflow() {
        let c = ReplayCache::default();
        let skew = Duration::from_secs(10);
        let n = [7u8; NONCE_LEN];
        assert!(c.check(now_ms(), &n, skew).is_ok());
        assert!(c.check(now_ms(), &n, skew).is_err());
        assert!(c.check(now_ms() - 60_000, &[8; NONCE_LEN], skew).is_err());
        assert!(c.check(now_ms() + 60_000, &[9; NONCE_LEN], skew).is_err());
    }

    #[test]
    fn bindings_keep_a_name_with_its_credential() {
        let b = Bindings::default();
        let p = |cred: &str, t| Proof {
            credential: cred.into(),
            issued_ms: t,
            owner_commit: [0; 32],
        };
        assert!(b.check("me", "x", &p("a", 10), true, 10).is_ok());
        b.record("x", &p("a", 10));
        assert!(b.check("me", "x", &p("b", 20), true, 10).is_err());
        assert!(b.check("me", "x", &p("a", 5), true, 10).is_err(), "replay");
        assert!(
            b.check("me", "x", &p("a", 5), false, 10).is_ok(),
            "same incarnation"
        );
        assert!(b.check("me", "x", &p("a", 11), true, 10).is_ok());
        assert!(
            b.check("me", "y", &p("a", 1), true, 1).is_err(),
            "table full"
        );
    }
}
