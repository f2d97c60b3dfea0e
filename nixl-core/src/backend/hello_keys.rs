//! Hello keys: each incarnation signs its unauthenticated hellos with a key of its own, and a
//! receiver counts a hello under a name only when it verifies under the key that holds the
//! name (see [`crate::backend::hello`]).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

use crate::auth;
use crate::bytes::{ByteReader, ByteWriter};
use crate::error::{DecodeError, Result};
use crate::liveness::ProcessId;

/// Version of the signed trailer of an unauthenticated hello.
pub(crate) const KEYED: u8 = 1;
/// Bytes of an Ed25519 public key.
pub const HELLO_KEY_LEN: usize = 32;

/// Who holds a name for hellos (without a credential).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A loaded incarnation: the key its metadata announced (`None`: it announced none, as
    /// nixl-rs before metadata version 5 and NIXL peers), and its process on this host.
    Loaded {
        key: Option<[u8; HELLO_KEY_LEN]>,
        process: Option<ProcessId>,
    },
    /// Not loaded: the first signed hello under the name, and the live process of this host
    /// it named (the name is free again once that process has exited).
    First {
        key: [u8; HELLO_KEY_LEN],
        process: ProcessId,
    },
}

impl Holder {
    fn key(&self) -> Option<&[u8; HELLO_KEY_LEN]> {
        match self {
            Holder::Loaded { key, .. } => key.as_ref(),
            Holder::First { key, .. } => Some(key),
        }
    }

    /// Whether the holding process is known to have exited (a restart may take the name).
    fn exited(&self) -> bool {
        let process = match self {
            Holder::Loaded { process, .. } => process.as_ref(),
            Holder::First { process, .. } => Some(process),
        };
        process.is_some_and(|p| p.local_pid().is_none())
    }
}

/// This incarnation's hello key, and which key each peer name's hellos must verify under
/// (without a credential; see the module's documentation). One per agent, shared by its
/// backends.
pub struct HelloKeys {
    pub(crate) key: SigningKey,
    pub(crate) process: Option<ProcessId>,
    pub(crate) names: Mutex<HashMap<String, Holder>>,
    pub(crate) max_names: usize,
    pub(crate) refused: AtomicU64,
    /// Count hellos only under names this agent loaded (`AgentConfig::loaded_senders_only`).
    pub(crate) loaded_only: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for HelloKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelloKeys")
            .field("public", &self.public())
            .field("names", &self.names.lock().len())
            .finish()
    }
}

impl HelloKeys {
    /// A fresh key for an incarnation running in `process`; at most `max_names` names held
    /// by hellos alone (loaded peers are bounded by the agent's own limits).
    pub fn generate(process: Option<ProcessId>, max_names: usize) -> Result<Self> {
        Ok(HelloKeys {
            key: SigningKey::from_bytes(&auth::random::<32>()?),
            process,
            names: Mutex::new(HashMap::new()),
            max_names: max_names.max(1),
            refused: AtomicU64::new(0),
            loaded_only: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Counts notifications (and lease messages) only from names this agent loaded, on sessions
    /// whose hello was signed with the loaded key: anything else is dropped and counted.
    pub fn set_loaded_only(&self, on: bool) {
        self.loaded_only.store(on, Ordering::Relaxed);
    }

    /// The public key this incarnation's metadata announces.
    pub fn public(&self) -> [u8; HELLO_KEY_LEN] {
        self.key.verifying_key().to_bytes()
    }

    /// A peer's incarnation was loaded (the agent calls this after each load).
    pub fn loaded(&self, name: &str, key: Option<[u8; HELLO_KEY_LEN]>, process: Option<ProcessId>) {
        self.names
            .lock()
            .insert(name.to_owned(), Holder::Loaded { key, process });
    }

    /// A loaded peer was forgotten (invalidated): its name is free for hellos again.
    pub fn forgotten(&self, name: &str) {
        let mut g = self.names.lock();
        if matches!(g.get(name), Some(Holder::Loaded { .. })) {
            g.remove(name);
        }
    }

    /// Hellos (and notifications on sessions) refused because they did not verify under the
    /// key that holds their name.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Signs `body` (an unauthenticated hello) and appends the signed trailer.
    pub(crate) fn sign(&self, w: &mut ByteWriter) {
        w.put_u8(KEYED).put(&self.public());
        match &self.process {
            Some(p) => {
                w.put_bool(true);
                crate::codec::write_process(w, p);
            }
            None => {
                w.put_bool(false);
            }
        }
        let sig = self.key.sign(w.as_slice());
        w.put(&sig.to_bytes());
    }

    /// Decides whether a hello under `sender`, signed by `signed` (its key and the process
    /// it named) or by nothing, counts; binds a free name to a signed hello's live process.
    pub(crate) fn admit(
        &self,
        sender: &str,
        signed: Option<([u8; HELLO_KEY_LEN], Option<ProcessId>)>,
    ) -> std::result::Result<Option<[u8; HELLO_KEY_LEN]>, String> {
        let mut g = self.names.lock();
        let key = signed.map(|(k, _)| k);
        match g.get(sender).copied() {
            Some(h) if h.key().is_none() => Ok(key),
            Some(h) if h.key() == key.as_ref() => Ok(key),
            Some(h) if h.exited() => {
                if let (Holder::First { .. }, Some((k, Some(p)))) = (h, signed) {
                    if p.local_pid().is_some() {
                        g.insert(sender.to_owned(), Holder::First { key: k, process: p });
                    }
                }
                Ok(key)
            }
            Some(h) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                let held = match h {
                    Holder::Loaded { .. } => "its loaded metadata announced",
                    Holder::First { .. } => "its first hello was signed with",
                };
                Err(match key {
                    Some(_) => format!(
                        "a hello claiming to be {sender} is signed with another key than {held} \
                         (another process)"
                    ),
                    None => format!(
                        "an unsigned hello claiming to be {sender}, whose name is held by the key \
                         {held}"
                    ),
                })
            }
            // Loaded senders only: the session opens (the sender's metadata may be loaded
            // right after its hello), but nothing on it counts until the name is loaded with
            // this key ([`HelloKeys::counts`]); no name is bound by the hello.
            None if self.loaded_only.load(Ordering::Relaxed) => Ok(key),
            None => {
                if let Some((k, Some(p))) = signed {
                    if g.len() < self.max_names && p.local_pid().is_some() {
                        g.insert(sender.to_owned(), Holder::First { key: k, process: p });
                    }
                }
                Ok(key)
            }
        }
    }

    /// Whether a notification on a session opened by a hello under `sender` signed with
    /// `key` still counts (the name's holder may have changed since: a load).
    pub(crate) fn counts(&self, sender: &str, key: Option<&[u8; HELLO_KEY_LEN]>) -> bool {
        let g = self.names.lock();
        // A loaded holder that exited: other keys count once its successor is loaded (the
        // name may be held for it: `AgentConfig::succession`).
        let ok = match g.get(sender) {
            None => !self.loaded_only.load(Ordering::Relaxed),
            Some(h @ Holder::Loaded { .. }) => h.key().is_none() || h.key() == key,
            Some(h) => h.key().is_none() || h.key() == key || h.exited(),
        };
        if !ok {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }
}

/// Reads and verifies the signed trailer of an unauthenticated hello: the key it verifies
/// under and the process it names.
pub(crate) fn read_signed(
    bytes: &[u8],
    r: &mut ByteReader<'_>,
) -> std::result::Result<([u8; HELLO_KEY_LEN], Option<ProcessId>), DecodeError> {
    if r.u8()? != KEYED {
        return Err(DecodeError::Invalid {
            what: "hello trailer version",
        });
    }
    let key: [u8; HELLO_KEY_LEN] = r.array()?;
    let process = if r.bool("hello process flag")? {
        Some(crate::codec::read_process(r)?)
    } else {
        None
    };
    let signed_len = r.position();
    let sig: [u8; 64] = r.array()?;
    let ok = VerifyingKey::from_bytes(&key).is_ok_and(|vk| {
        vk.verify(&bytes[..signed_len], &Signature::from_bytes(&sig))
            .is_ok()
    });
    if !ok {
        return Err(DecodeError::Invalid {
            what: "hello signature",
        });
    }
    Ok((key, process))
}
