//! nixlbench-style throughput CLI (filled by the UCX issue).
fn main() {}
