//! Criterion bench of two agents in one process (filled by the UCX issue).
fn main() {}
