//! What the storage plugins (POSIX, GDS, OBJ) share: a storage request is local (the agent's
//! memory and its own files or objects), carries no notification and moves the kinds the
//! plugin names; registrations and requests take only the plugin's own metadata. One
//! description per plugin ([`Storage`]) gives its capabilities and these checks, each with the
//! typed error that names the plugin.

use std::any::Any;

use nixl_core::backend::{downcast_md, BackendMd, Capabilities, XferSpec};
use nixl_core::{Error, MemKind, Op, Result};

/// A storage plugin as the shared checks see it.
pub(crate) struct Storage {
    /// The plugin's name (`POSIX`, `GDS`, `OBJ`).
    pub name: &'static str,
    /// What its targets are called in errors (`files`, `objects`).
    pub targets: &'static str,
    /// The kinds a request's local side may be.
    pub local: &'static [MemKind],
    /// The kinds a request's target side may be.
    pub remote: &'static [MemKind],
}

fn names(kinds: &[MemKind]) -> String {
    let k: Vec<String> = kinds.iter().map(|k| k.to_string()).collect();
    k.join("/")
}

impl Storage {
    /// Local requests only, over the plugin's kinds; no notifications, no progress thread.
    pub(crate) fn capabilities(&self) -> Capabilities {
        Capabilities::storage(self.kinds())
    }

    /// The kinds it registers: each side's.
    fn kinds(&self) -> Vec<MemKind> {
        let mut kinds = self.local.to_vec();
        kinds.extend(self.remote.iter().filter(|k| !self.local.contains(k)));
        kinds
    }

    /// The checks every request of the plugin passes first: local, of its kinds, without a
    /// notification.
    pub(crate) fn check_request(&self, agent: &str, spec: &XferSpec) -> Result<()> {
        let refuse = |why: String| Err(Error::not_supported(agent, Op::MakeXfer, why));
        if !spec.is_local {
            return refuse(format!(
                "{} moves data between this agent's memory and its {} only",
                self.name, self.targets
            ));
        }
        if !self.local.contains(&spec.local_kind) || !self.remote.contains(&spec.remote_kind) {
            return refuse(format!(
                "{} moves {} <-> {}, not {} <-> {}",
                self.name,
                names(self.local),
                names(self.remote),
                spec.local_kind,
                spec.remote_kind
            ));
        }
        if spec.notif.is_some() {
            return refuse(format!("{} has no notifications", self.name));
        }
        Ok(())
    }

    /// The error for a region of a kind the plugin does not register.
    pub(crate) fn refuse_region(&self, agent: &str, kind: MemKind) -> Error {
        Error::not_supported(
            agent,
            Op::RegisterMem,
            format!(
                "{} registers {}, not {kind}",
                self.name,
                names(&self.kinds())
            ),
        )
    }

    /// Deregistration's check: `ours` says whether the metadata is one of the plugin's types.
    pub(crate) fn check_deregister(&self, agent: &str, ours: bool) -> Result<()> {
        if ours {
            Ok(())
        } else {
            Err(Error::invalid(
                agent,
                Op::DeregisterMem,
                format!("not {} metadata", self.name),
            ))
        }
    }

    /// Metadata `md` of segment `i` (`side`: `local` or `target`) and its value as the
    /// plugin's type `T` (`what` it is, for the error; empty: the plugin's own), or the typed
    /// error that names what it is not.
    pub(crate) fn segment_md<'a, T: Any + Send + Sync>(
        &self,
        agent: &str,
        (i, side): (usize, &str),
        md: Option<&'a BackendMd>,
        what: &str,
    ) -> Result<(&'a BackendMd, &'a T)> {
        let md = md.ok_or_else(|| {
            Error::invalid(
                agent,
                Op::MakeXfer,
                format!("segment {i} names no {side} metadata"),
            )
        })?;
        let value = downcast_md::<T>(md).ok_or_else(|| self.not_its(agent, (i, side), what))?;
        Ok((md, value))
    }

    /// [`Storage::segment_md`]'s value, shared.
    #[cfg(feature = "gds")]
    pub(crate) fn segment_arc<T: Any + Send + Sync>(
        &self,
        agent: &str,
        at: (usize, &str),
        md: Option<&BackendMd>,
        what: &str,
    ) -> Result<std::sync::Arc<T>> {
        let (md, _) = self.segment_md::<T>(agent, at, md, what)?;
        std::sync::Arc::clone(md)
            .downcast::<T>()
            .map_err(|_| self.not_its(agent, at, what))
    }

    fn not_its(&self, agent: &str, (i, side): (usize, &str), what: &str) -> Error {
        Error::invalid(
            agent,
            Op::MakeXfer,
            match what {
                "" => format!("segment {i}: {side} metadata is not {}'s", self.name),
                _ => format!("segment {i}: {side} metadata is not {} {what}", self.name),
            },
        )
    }
}
