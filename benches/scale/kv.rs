//! KV mode (placeholder).
use super::{Opts, Res, Which};
pub fn run_models(_w: Which, _o: &Opts) -> Res<()> {
    Err("not yet".into())
}
