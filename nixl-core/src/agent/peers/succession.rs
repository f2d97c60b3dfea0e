//! Handing an agent's name to its next incarnation (`AgentConfig::succession`).
//!
//! An incarnation reads the secret its predecessor left in the succession file, reveals it in
//! its metadata, and leaves a fresh secret for its successor, committing to it (SHA-256 under
//! the owner domain). A peer that loaded an incarnation holds its name for the successor: a new
//! incarnation's metadata under the name must reveal the committed secret, until
//! `Limits::succession_hold` has passed since the holder exited or was invalidated.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use crate::codec::{AgentMetadata, Succession};
use crate::error::{Error, Op, Result};

/// Bytes of a succession secret.
const SECRET: usize = 32;

/// Reads the predecessor's secret from `path` (none: a first incarnation), leaves a fresh one
/// for the successor, and returns what this incarnation's metadata announces.
pub(crate) fn take(agent: &str, path: &Path) -> Result<Succession> {
    let reveal = read_secret(agent, path)?;
    let next: [u8; SECRET] = crate::auth::random()?;
    write_secret(agent, path, &next)?;
    Ok(Succession {
        reveal,
        next: crate::auth::commit(&next),
    })
}

fn refuse(agent: &str, path: &Path, why: impl std::fmt::Display) -> Error {
    Error::not_allowed(
        agent,
        Op::CreateBackend,
        format!("succession file {}: {why}", path.display()),
    )
}

fn read_secret(agent: &str, path: &Path) -> Result<Option<[u8; SECRET]>> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(refuse(agent, path, e)),
    };
    let m = f.metadata().map_err(|e| refuse(agent, path, e))?;
    if !m.is_file() {
        return Err(refuse(agent, path, "not a regular file"));
    }
    if m.uid() != rustix::process::geteuid().as_raw() || m.mode() & 0o077 != 0 {
        return Err(refuse(
            agent,
            path,
            format!(
                "must be this user's and readable by it alone (uid {}, mode {:o})",
                m.uid(),
                m.mode() & 0o777
            ),
        ));
    }
    let mut b = Vec::with_capacity(SECRET + 1);
    (&f).take(SECRET as u64 + 1)
        .read_to_end(&mut b)
        .map_err(|e| refuse(agent, path, e))?;
    let s: [u8; SECRET] = b.as_slice().try_into().map_err(|_| {
        refuse(
            agent,
            path,
            format!("holds {} bytes, not {SECRET}", b.len()),
        )
    })?;
    Ok(Some(s))
}

/// Replaces the file with `secret` (a fresh file of mode 0600, synced, then renamed over it).
fn write_secret(agent: &str, path: &Path, secret: &[u8; SECRET]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&tmp)
        .map_err(|e| refuse(agent, &tmp, e))?;
    f.write_all(secret)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            refuse(agent, path, e)
        })
}

/// A name held for its successor: the commitment, and since when its holder is gone (`None`:
/// it may still run).
#[derive(Debug, Clone, Copy)]
struct Held {
    next: [u8; 32],
    gone_since: Option<Instant>,
}

/// The names this agent holds for their successors.
#[derive(Debug, Default)]
pub(crate) struct Successions {
    held: parking_lot::Mutex<HashMap<String, Held>>,
}

impl Successions {
    /// A new incarnation of `md.name` was loaded: the name is held for its successor if it
    /// committed to one (at most `max` names held; past it, a name is simply not held).
    pub(crate) fn loaded(&self, md: &AgentMetadata, max: usize) {
        let mut g = self.held.lock();
        match md.succession {
            Some(s) if g.len() < max || g.contains_key(&md.name) => {
                g.insert(
                    md.name.clone(),
                    Held {
                        next: s.next,
                        gone_since: None,
                    },
                );
            }
            _ => {
                g.remove(&md.name);
            }
        }
    }

    /// The holder of `name` was invalidated: the hold runs from now.
    pub(crate) fn gone(&self, name: &str) {
        if let Some(h) = self.held.lock().get_mut(name) {
            h.gone_since.get_or_insert_with(Instant::now);
        }
    }

    /// Whether `md`, a new incarnation of its name, may be loaded: its holder (if the name is
    /// held) must be gone (`holder_live` false) and `md` reveal the committed secret, or the
    /// hold must have passed.
    pub(crate) fn check(
        &self,
        me: &str,
        md: &AgentMetadata,
        holder_live: bool,
        hold: std::time::Duration,
    ) -> Result<()> {
        let mut g = self.held.lock();
        let Some(h) = g.get_mut(&md.name) else {
            return Ok(());
        };
        if holder_live {
            // A live holder's name: the owner check decides (its own process, or refused).
            return Ok(());
        }
        let revealed = md
            .succession
            .and_then(|s| s.reveal)
            .is_some_and(|r| crate::auth::commit(&r) == h.next);
        if revealed {
            return Ok(());
        }
        let since = *h.gone_since.get_or_insert_with(Instant::now);
        let left = hold.saturating_sub(since.elapsed());
        if left.is_zero() {
            return Ok(());
        }
        Err(Error::not_allowed(
            me,
            Op::LoadMetadata,
            format!(
                "{} is held for its next incarnation (which reveals the secret its \
                 predecessor committed to) for {} ms more",
                md.name,
                left.as_millis()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("nixl-succ-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn each_incarnation_reveals_what_its_predecessor_committed_to() {
        let d = dir("chain");
        let p = d.join("a.secret");
        let first = take("a", &p).unwrap();
        assert_eq!(first.reveal, None, "a first incarnation");
        let second = take("a", &p).unwrap();
        let r = second.reveal.expect("the predecessor's secret");
        assert_eq!(crate::auth::commit(&r), first.next);
        assert_ne!(second.next, first.next);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_others_may_read_or_of_another_size_or_a_link_is_refused() {
        let d = dir("bad");
        let p = d.join("a.secret");
        take("a", &p).unwrap();
        let before = std::fs::read(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = take("a", &p).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::NotAllowed, "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), before, "unchanged");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&p, [1u8; 31]).unwrap();
        assert!(take("a", &p).is_err(), "31 bytes");
        let l = d.join("link.secret");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert!(take("a", &l).is_err(), "a symbolic link");
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn md(name: &str, succession: Option<Succession>) -> AgentMetadata {
        AgentMetadata {
            name: name.into(),
            generation: 1,
            has_conn_info: true,
            process: None,
            verifies_integrity: false,
            hello_key: None,
            succession,
            backends: vec![],
            regions: vec![],
        }
    }

    #[test]
    fn a_held_name_goes_to_the_revealer_or_anyone_after_the_hold() {
        let s = Successions::default();
        let secret = [9u8; 32];
        let holder = md(
            "p",
            Some(Succession {
                reveal: None,
                next: crate::auth::commit(&secret),
            }),
        );
        s.loaded(&holder, 16);
        let hold = std::time::Duration::from_millis(50);
        let stranger = md("p", None);
        assert!(
            s.check("me", &stranger, true, hold).is_ok(),
            "live: the owner check decides"
        );
        let e = s.check("me", &stranger, false, hold).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::NotAllowed, "{e}");
        let wrong = md(
            "p",
            Some(Succession {
                reveal: Some([8; 32]),
                next: [0; 32],
            }),
        );
        assert!(s.check("me", &wrong, false, hold).is_err());
        let heir = md(
            "p",
            Some(Succession {
                reveal: Some(secret),
                next: [0; 32],
            }),
        );
        assert!(s.check("me", &heir, false, hold).is_ok());
        std::thread::sleep(hold);
        assert!(
            s.check("me", &stranger, false, hold).is_ok(),
            "the hold passed"
        );
        // Bounded: past `max` names, a new one is not held.
        let other = md("q", holder.succession);
        s.loaded(&other, 1);
        assert!(s.check("me", &stranger_named("q"), false, hold).is_ok());
    }

    fn stranger_named(n: &str) -> AgentMetadata {
        md(n, None)
    }
}
