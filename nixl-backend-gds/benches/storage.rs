//! Storage throughput bench (filled in later).
fn main() {}
