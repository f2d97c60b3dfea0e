//! The agent's metadata in NIXL's wire format: making it, and reading a NIXL peer's.

use crate::agent::remote::MetadataSelection;
use crate::agent::Agent;
use crate::codec::{AgentMetadata, BackendEntry, RegionEntry};
use crate::error::{Error, Op, Result};
use crate::mem::{MemKind, RegionDesc};
use crate::nixl_wire::agent::derived_generation;
use crate::nixl_wire::metadata::{NixlConn, NixlDesc, NixlMetadata, NixlSection};
use crate::nixl_wire::Wire;
use std::collections::BTreeMap;

impl Agent {
    /// The agent's full metadata as a stock NIXL agent's `getLocalMD` writes it, for NIXL
    /// peers: connection info and regions of every backend that speaks NIXL's wire
    /// ([`crate::nixl_wire::NixlWire`]).
    #[doc(alias = "getLocalMD")]
    #[deprecated(note = "use `agent.nixl().local_metadata()`")]
    pub fn local_nixl_metadata(&self) -> Result<Vec<u8>> {
        self.nixl().local_metadata()
    }

    /// Partial metadata in NIXL's format.
    #[doc(alias = "getLocalPartialMD")]
    #[deprecated(note = "use `agent.nixl().local_partial_metadata(sel)`")]
    pub fn local_partial_nixl_metadata(&self, sel: &MetadataSelection<'_>) -> Result<Vec<u8>> {
        self.nixl().local_partial_metadata(sel)
    }

    pub(crate) fn nixl_full_metadata(&self) -> Result<Vec<u8>> {
        self.nixl_partial_metadata(&MetadataSelection {
            registrations: None,
            include_conn: true,
        })
    }

    pub(crate) fn nixl_partial_metadata(&self, sel: &MetadataSelection<'_>) -> Result<Vec<u8>> {
        let backends = self.shared.backends();
        let mut conns = Vec::new();
        if sel.include_conn {
            for b in &backends {
                if let (true, Some(n)) = (b.caps.remote, b.backend.nixl_wire()) {
                    conns.push(NixlConn {
                        backend: b.name.clone(),
                        info: n.nixl_connection_info()?,
                    });
                }
            }
        }
        // Sections in NIXL's order: by memory kind, then backend; descriptors sorted.
        let mut sections: BTreeMap<(MemKind, usize), (String, Vec<NixlDesc>)> = BTreeMap::new();
        for reg in self.selected_registrations(sel, crate::agent::remote::Audience::Anyone)? {
            for r in &reg.regions {
                for (slot, md) in r.mds.lock().iter() {
                    let Some(n) = slot.backend.nixl_wire().filter(|_| slot.caps.remote) else {
                        continue;
                    };
                    sections
                        .entry((r.desc.kind, slot.id))
                        .or_insert_with(|| (slot.name.clone(), Vec::new()))
                        .1
                        .push(NixlDesc {
                            addr: r.desc.addr,
                            len: r.desc.len,
                            dev_id: r.desc.dev_id,
                            public: n.nixl_public_metadata(md)?,
                        });
                }
            }
        }
        let sections = sections
            .into_iter()
            .map(|((kind, _), (backend, mut descs))| {
                descs.sort_by_key(|d| (d.addr, d.len, d.dev_id));
                NixlSection {
                    backend,
                    kind,
                    descs,
                }
            })
            .collect();
        Ok(NixlMetadata {
            name: self.shared.name.clone(),
            conns,
            sections,
        }
        .encode())
    }

    /// The wire format a loaded peer speaks.
    pub fn peer_wire(&self, remote: &str) -> Option<Wire> {
        self.shared.remotes.lock().get(remote).map(|p| p.wire)
    }

    /// Turns a decoded NIXL blob into the agent's loading form. A blob without connection
    /// info belongs to the NIXL incarnation already loaded under that name, if any.
    pub(crate) fn nixl_to_agent_metadata(&self, md: NixlMetadata) -> Result<AgentMetadata> {
        let generation = if md.conns.is_empty() {
            self.shared
                .remotes
                .lock()
                .get(&md.name)
                .filter(|p| p.wire == Wire::Nixl)
                .map_or(0, |p| p.generation)
        } else {
            derived_generation(&md.conns)
        };
        let has_conn_info = !md.conns.is_empty();
        let mut backends: Vec<BackendEntry> = md
            .conns
            .into_iter()
            .map(|c| BackendEntry {
                name: c.backend,
                conn_info: c.info,
            })
            .collect();
        let mut regions = Vec::new();
        for s in md.sections {
            let idx = match backends.iter().position(|b| b.name == s.backend) {
                Some(i) => i,
                None => {
                    backends.push(BackendEntry {
                        name: s.backend.clone(),
                        conn_info: Vec::new(),
                    });
                    backends.len() - 1
                }
            };
            for d in s.descs {
                regions.push(RegionEntry {
                    label: String::new(),
                    backend: idx,
                    desc: RegionDesc {
                        kind: s.kind,
                        addr: d.addr,
                        len: d.len,
                        dev_id: d.dev_id,
                        meta: Vec::new(),
                    },
                    public: d.public,
                });
            }
        }
        if backends.len() > crate::codec::MAX_BACKENDS {
            return Err(Error::invalid(
                self.name(),
                Op::LoadMetadata,
                "too many backends in a NIXL blob",
            ));
        }
        Ok(AgentMetadata {
            name: md.name,
            generation,
            has_conn_info,
            // A stock NIXL agent does not say which process it is: no same-host liveness
            // watch (its endpoints' failures still end transfers).
            process: None,
            verifies_integrity: false,
            hello_key: None,
            succession: None,
            backends,
            regions,
        })
    }
}
