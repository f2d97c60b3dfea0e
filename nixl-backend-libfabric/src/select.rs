//! Provider and domain selection: `fi_getinfo` with hints for RDM endpoints that do RMA and
//! messages, accepting every memory-registration mode this crate honours.

// bindgen types each flag constant by its value (u32 or u64); widening all of them alike keeps
// the code independent of which flags happen to fit in 32 bits.
#![allow(clippy::useless_conversion)]

use crate::params::{HmemMode, LibfabricParams, DEFAULT_PROVIDERS};
use crate::result::FiError;
use crate::sys::info::{Entry, Info, RdmHints, StrField};
use crate::sys::{self, Lib};

/// What was chosen: one info per rail, and the features the provider granted.
pub(crate) struct Selection {
    pub provider: String,
    pub infos: Vec<Info>,
    pub hmem: bool,
    pub delivery_complete: bool,
}

/// The memory-registration modes this crate handles (local descriptors, virtual addresses,
/// provider keys, allocated memory, endpoint-bound registrations; device memory with hmem).
fn mr_modes(hmem: bool) -> i32 {
    let mut m = sys::FI_MR_LOCAL
        | sys::FI_MR_VIRT_ADDR
        | sys::FI_MR_ALLOCATED
        | sys::FI_MR_PROV_KEY
        | sys::FI_MR_ENDPOINT;
    if hmem {
        m |= sys::FI_MR_HMEM;
    }
    m as i32
}

fn hints(
    lib: &'static Lib,
    provider: &str,
    domain: Option<&str>,
    hmem: bool,
    dc: bool,
) -> Result<Info, FiError> {
    let mut h = Info::hints(lib)?;
    h.set_str(StrField::Provider, provider)?;
    if let Some(d) = domain {
        h.set_str(StrField::Domain, d)?;
    }
    let mut caps = u64::from(sys::FI_MSG)
        | u64::from(sys::FI_RMA)
        | u64::from(sys::FI_READ)
        | u64::from(sys::FI_WRITE);
    caps |= u64::from(sys::FI_REMOTE_READ)
        | u64::from(sys::FI_REMOTE_WRITE)
        | u64::from(sys::FI_SEND)
        | u64::from(sys::FI_RECV);
    if hmem {
        caps |= u64::from(sys::FI_HMEM);
    }
    h.set_rdm_hints(&RdmHints {
        caps,
        // Every operation carries an fi_context2-sized context (see rail.rs).
        mode: u64::from(sys::FI_CONTEXT) | u64::from(sys::FI_CONTEXT2),
        mr_mode: mr_modes(hmem),
        threading: sys::FI_THREAD_SAFE,
        msg_order: u64::from(sys::FI_ORDER_SAS),
        tx_op_flags: dc.then_some(u64::from(sys::FI_DELIVERY_COMPLETE)),
    })?;
    Ok(h)
}

/// Picks a provider and one info entry per rail.
pub(crate) fn select(lib: &'static Lib, p: &LibfabricParams) -> Result<Option<Selection>, FiError> {
    let providers: Vec<&str> = match &p.provider {
        Some(x) => vec![x.as_str()],
        None => DEFAULT_PROVIDERS.to_vec(),
    };
    let hmem_tries: &[bool] = match p.hmem {
        HmemMode::Auto => &[true, false],
        HmemMode::Off => &[false],
        HmemMode::Require => &[true],
    };
    let one_domain = (p.domains.len() == 1).then(|| p.domains[0].as_str());
    for prov in providers {
        for &hmem in hmem_tries {
            for dc in [true, false] {
                let h = hints(lib, prov, one_domain, hmem, dc)?;
                let Some(list) = h.getinfo(sys::API_VERSION)? else {
                    continue;
                };
                let groups = domain_groups(&list, &p.domains);
                // Every domain asked for, or none: a missing one must not be replaced by
                // another rail on a domain already used (a silent loss of bandwidth).
                if groups.is_empty() || (!p.domains.is_empty() && groups.len() < p.domains.len()) {
                    continue;
                }
                let mut infos = Vec::with_capacity(p.rails);
                for r in 0..p.rails {
                    infos.push(list.dup(groups[r % groups.len()])?);
                }
                let provider = infos[0].first().provider_name();
                tracing::debug!(%provider, hmem, delivery_complete = dc, rails = p.rails, "libfabric provider selected");
                return Ok(Some(Selection {
                    provider,
                    infos,
                    hmem,
                    delivery_complete: dc,
                }));
            }
        }
    }
    Ok(None)
}

/// One entry per distinct domain (the wanted ones, in the wanted order, when given; a wanted
/// one the list lacks is left out), preferring IPv4 addressing where a domain offers several
/// formats.
fn domain_groups<'a>(list: &'a Info, wanted: &[String]) -> Vec<Entry<'a>> {
    let mut out: Vec<(String, Entry<'a>)> = Vec::new();
    for e in list.entries() {
        let name = e.domain_name();
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => {
                if e.addr_format == sys::FI_SOCKADDR_IN && slot.1.addr_format != sys::FI_SOCKADDR_IN
                {
                    slot.1 = e;
                }
            }
            None => out.push((name, e)),
        }
    }
    if wanted.is_empty() {
        return out.into_iter().map(|(_, e)| e).collect();
    }
    wanted
        .iter()
        .filter_map(|w| out.iter().find(|(n, _)| n == w).map(|(_, e)| *e))
        .collect()
}
