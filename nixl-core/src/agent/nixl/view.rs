//! `agent.nixl()`: the agent's calls in NIXL's own wire format.

use crate::nixl_wire::NixlView;
use crate::Agent;

impl Agent {
    /// This agent over NIXL's wire, for stock NIXL peers (`docs/interop.md`).
    pub fn nixl(&self) -> NixlView<'_> {
        NixlView { agent: self }
    }
}
