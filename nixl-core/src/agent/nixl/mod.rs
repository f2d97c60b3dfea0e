//! NIXL's wire from the agent: its metadata blobs, its side channel's commands, the view that
//! gathers the calls (`Agent::nixl`).

mod comm;
mod metadata;
mod view;
