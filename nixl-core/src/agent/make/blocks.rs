//! Building requests by block ids over block tables ([`Agent::make_block_xfer`]): O(layers +
//! ids) up to the backend, which gets the layers and id runs ([`BlockXferSpec`]) or, where it
//! does not consume strides, the blocks materialized into segments.

use crate::agent::options::XferOptions;
use crate::agent::prep::{FlatTable, PrepLayer, PreparedList};
use crate::agent::request::{PathNote, XferReq};
use crate::agent::spec::ReqSpec;
use crate::agent::{Agent, BackendSlot};
use crate::backend::BackendXfer;
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};
use crate::strided::{block_runs, push_run, BlockRun, BlockXferSpec, LayerPair};
use crate::tiles::TileShape;

impl Agent {
    /// Builds a request by block ids over two block tables ([`Agent::prep_strided_dlist`]):
    /// in every layer `l`, block `local_blocks[k]` of local layer `l` moves to block
    /// `remote_blocks[k]` of remote layer `l` (vLLM's and SGLang's shape: one block id list
    /// for all layers and K/V). O(layers + ids): ids are checked against the smallest layer,
    /// and a backend that consumes strides (the copy kernel of `CUDA_IPC`, `INPROC`, UCX's
    /// per-block loop, POSIX vectored I/O) gets the layers and id runs, never one descriptor
    /// per block; others get the blocks as segments ([`XferReq::path`] says which). Ids
    /// consecutive on both sides merge into runs (a run of a layer whose blocks are dense on
    /// both sides is one segment) unless [`XferOptions::no_merge`].
    ///
    /// Refused with [`Error::InvalidParam`] for lists that are not block tables, no ids, ids
    /// past a layer's end; with [`Error::Mismatch`] for different layer counts, block
    /// lengths or id counts.
    pub fn make_block_xfer(
        &self,
        op: XferOp,
        local: &PreparedList,
        local_blocks: &[usize],
        remote: &PreparedList,
        remote_blocks: &[usize],
        opts: XferOptions,
    ) -> Result<XferReq> {
        let me = self.name();
        let ends = self.ends(op, local, remote, &opts)?;
        let (Some(ll), Some(rl)) = (local.table_layers(), remote.table_layers()) else {
            return Err(Error::invalid(
                me,
                Op::MakeXfer,
                "block ids need lists prepared from block tables (prep_strided_dlist)",
            ));
        };
        check_shapes(me, ll, rl, (local_blocks.len(), remote_blocks.len()))?;
        check_ids(me, "local", local_blocks, ll)?;
        check_ids(me, "remote", remote_blocks, rl)?;
        // The destination's blocks are written once: an id listed twice would land two
        // source blocks in one.
        let (side, dst) = match op {
            XferOp::Read => ("local", local_blocks),
            XferOp::Write => ("remote", remote_blocks),
        };
        crate::agent::make::check_distinct(me, side, dst)?;
        let runs = block_runs(local_blocks, remote_blocks, !opts.no_merge);
        self.make_table(op, (local, remote), (ll, rl), ends, runs, None, opts)
    }

    /// [`Agent::make_prepped_xfer`] over two descriptor lists that are block tables
    /// ([`FlatTable`]), where the indices are groups of equal length, each naming one layer
    /// on each side (the destination's layers distinct) and the same block ids in every
    /// group: the block-table request of those layers and ids. `None` where the indices have
    /// another shape or the table path refuses them (the caller builds the request from the
    /// lists, which names any problem in their terms). Linear in the indices, no allocation
    /// per index beyond the two id lists.
    pub(crate) fn flat_as_table(
        &self,
        op: XferOp,
        (local, local_idx): (&PreparedList, &[usize]),
        (remote, remote_idx): (&PreparedList, &[usize]),
        ends: &crate::agent::make::Ends,
        opts: &XferOptions,
    ) -> Option<XferReq> {
        // Integrity checks and arrival counters are defined per descriptor list here.
        if opts.integrity || opts.arrival.is_some() {
            return None;
        }
        let (lt, rt) = (local.table.as_ref()?, remote.table.as_ref()?);
        let merge = !opts.no_merge;
        let ids = period_ids(op, (lt, local_idx), (rt, remote_idx), merge)
            .or_else(|| table_ids(op, (lt, local_idx), (rt, remote_idx), merge))?;
        check_shapes(
            self.name(),
            &ids.local_layers,
            &ids.remote_layers,
            (ids.ids, ids.ids),
        )
        .ok()?;
        self.make_table(
            op,
            (local, remote),
            (&ids.local_layers, &ids.remote_layers),
            ends.clone(),
            ids.runs,
            None,
            opts.clone(),
        )
        .ok()
    }

    /// The one path of block-table requests, whole blocks and tiles alike (a block is the
    /// identity tile): offers the table to every backend holding every layer's regions (only
    /// to those that rearrange rows where `rows` is set), the first that takes it makes the
    /// request; whole blocks a backend does not consume as strides are materialized into
    /// segments for it. The caller checked the ids or tiles.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn make_table(
        &self,
        op: XferOp,
        (local, remote): (&PreparedList, &PreparedList),
        (ll, rl): (&[PrepLayer], &[PrepLayer]),
        mut ends: crate::agent::make::Ends,
        mut runs: Vec<BlockRun>,
        rows: Option<TileShape>,
        opts: XferOptions,
    ) -> Result<XferReq> {
        let me = self.name();
        self.arrival_ends(op, (local, ll.len()), &mut ends, &opts)?;
        for (a, b) in ll.iter().zip(rl) {
            let (lr, rr) = (
                &local.regions[a.region as usize],
                &remote.regions[b.region as usize],
            );
            crate::work::tick(ends.candidates.len());
            ends.candidates
                .retain(|s| lr.md(s.id).is_some() && rr.md(s.id).is_some());
        }
        let holders = ends.candidates.len();
        if rows.is_some() {
            ends.candidates.retain(|s| s.backend.rearranges_rows());
        }
        let notif = opts.notif.is_some();
        let mut refusals = Vec::new();
        let candidates = std::mem::take(&mut ends.candidates);
        let last = candidates.len().saturating_sub(1);
        for (c, slot) in candidates.into_iter().enumerate() {
            let spec = BlockXferSpec {
                op,
                local_kind: local.kind,
                remote_kind: remote.kind,
                remote: ends.remote_name.clone(),
                is_local: ends.is_local,
                layers: layer_pairs(me, &slot, ll, rl, local, remote)?,
                // The last candidate takes the runs; earlier ones work on a copy.
                runs: if c == last {
                    std::mem::take(&mut runs)
                } else {
                    runs.clone()
                },
                rows,
                notif: if opts.integrity {
                    None
                } else {
                    opts.notif.clone()
                },
                arrival: opts.arrival,
            };
            match prepare_on(me, &slot, spec) {
                Ok((x, spec, note)) => {
                    return self.request(
                        slot,
                        x,
                        spec,
                        (local, remote),
                        ends,
                        op,
                        &opts,
                        Some(note),
                    )
                }
                Err(e @ Error::NotSupported { .. }) => {
                    tracing::debug!(agent = %me, backend = %slot.name, error = %e, "backend declined the transfer");
                    refusals.push((slot.name.clone(), e));
                }
                Err(e) => return Err(e),
            }
        }
        Err(match rows {
            Some(_) => tile_refusal(me, (local, remote), holders, &refusals),
            None => refusals
                .pop()
                .map(|(_, e)| e)
                .unwrap_or_else(|| self.no_backend(local, remote, &ends, notif)),
        })
    }
}

/// The fewest blocks per layer for which requests over [`FlatTable`]s take the block-table
/// path.
const MIN_GROUP: usize = 4;

/// Index lists over two [`FlatTable`]s read as a block-table request: the layers, and the
/// block ids named in every layer as runs, checked (inside the layers, the destination's
/// distinct).
struct TableIds {
    local_layers: Vec<PrepLayer>,
    remote_layers: Vec<PrepLayer>,
    runs: Vec<BlockRun>,
    /// Block ids per layer.
    ids: usize,
}

/// Block ids `local[i] - lbase` and `remote[i] - rbase` as runs (consecutive pairs merged
/// where `merge`), in one pass that checks them: each below its side's `bound`, the
/// destination's (`op`'s) distinct. `None` where one is not (the caller then builds the
/// request from the lists, which names the problem in their terms).
fn checked_runs(
    op: XferOp,
    (local, lbase, lbound): (&[usize], usize, usize),
    (remote, rbase, rbound): (&[usize], usize, usize),
    merge: bool,
) -> Option<Vec<BlockRun>> {
    crate::work::tick(local.len());
    let dst_bound = match op {
        XferOp::Read => lbound,
        XferOp::Write => rbound,
    };
    let mut seen = crate::agent::make::IdBits::below(dst_bound);
    let mut runs: Vec<BlockRun> = Vec::with_capacity(local.len());
    for (&l, &r) in local.iter().zip(remote) {
        let (l, r) = (l.wrapping_sub(lbase), r.wrapping_sub(rbase));
        if l >= lbound || r >= rbound || !seen.insert(if op == XferOp::Read { l } else { r }) {
            return None;
        }
        push_run(&mut runs, BlockRun::blocks(l as u64, r as u64, 1), merge);
    }
    Some(runs)
}

/// How many leading `i` have `local[i] == local0[i] + dl` and `remote[i] == remote0[i] + dr`
/// (wrapping; the callers bound the values), compared a chunk at a time without a branch per
/// pair. The four slices have one length.
fn shifted_prefix(
    (local, local0, dl): (&[usize], &[usize], usize),
    (remote, remote0, dr): (&[usize], &[usize], usize),
) -> usize {
    const CHUNK: usize = 32;
    let n = local.len();
    let (local0, remote, remote0) = (&local0[..n], &remote[..n], &remote0[..n]);
    let chunks = local
        .chunks_exact(CHUNK)
        .zip(local0.chunks_exact(CHUNK))
        .zip(remote.chunks_exact(CHUNK).zip(remote0.chunks_exact(CHUNK)));
    let mut i = 0;
    for ((a, a0), (b, b0)) in chunks {
        // Whole chunks without a branch per pair: the differences OR-ed together (adds, XORs
        // and ORs vectorize on every x86-64; a 64-bit compare per pair would not without
        // SSE4.1).
        let differ =
            a.iter()
                .zip(a0)
                .zip(b.iter().zip(b0))
                .fold(0usize, |acc, ((&x, &x0), (&y, &y0))| {
                    acc | (x ^ x0.wrapping_add(dl)) | (y ^ y0.wrapping_add(dr))
                });
        if differ != 0 {
            break;
        }
        i += CHUNK;
    }
    i + local[i..]
        .iter()
        .zip(&local0[i..])
        .zip(remote[i..].iter().zip(&remote0[i..]))
        .take_while(|((&x, &x0), (&y, &y0))| x == x0.wrapping_add(dl) && y == y0.wrapping_add(dr))
        .count()
}

/// The layers and block ids `local_idx` and `remote_idx` name, where they are groups of one
/// length, each inside one layer per side, naming the same block ids as the first group,
/// with no destination layer named twice; `None` otherwise (an index past a list's end
/// included).
fn table_ids(
    op: XferOp,
    (lt, local_idx): (&FlatTable, &[usize]),
    (rt, remote_idx): (&FlatTable, &[usize]),
    merge: bool,
) -> Option<TableIds> {
    let (lp, rp) = (lt.per, rt.per);
    let (&l0, &r0) = (local_idx.first()?, remote_idx.first()?);
    // Ranges, not divisions, per index: a division costs more than the rest of the pass.
    let (lbase0, rbase0) = (l0 - l0 % lp, r0 - r0 % rp);
    let group = local_idx
        .iter()
        .zip(remote_idx)
        .take_while(|(&l, &r)| l.wrapping_sub(lbase0) < lp && r.wrapping_sub(rbase0) < rp)
        .count();
    if local_idx.len() != remote_idx.len() || !local_idx.len().is_multiple_of(group) {
        return None;
    }
    let groups = local_idx.len() / group;
    // A layer per few blocks costs the backends more per block than the segments would (and
    // a request of a few descriptors gains nothing).
    if group < MIN_GROUP {
        return None;
    }
    crate::work::tick(local_idx.len());
    let runs = checked_runs(
        op,
        (&local_idx[..group], lbase0, lp),
        (&remote_idx[..group], rbase0, rp),
        merge,
    )?;
    let (mut local_layers, mut remote_layers) =
        (Vec::with_capacity(groups), Vec::with_capacity(groups));
    let dst_count = match op {
        XferOp::Read => lt.layers.len(),
        XferOp::Write => rt.layers.len(),
    };
    let mut dst_seen = vec![false; dst_count];
    for (lc, rc) in local_idx
        .chunks_exact(group)
        .zip(remote_idx.chunks_exact(group))
    {
        let (ll, rl) = (lc[0] / lp, rc[0] / rp);
        let (lbase, rbase) = (ll * lp, rl * rp);
        let (la, ra) = (lt.layers.get(ll)?, rt.layers.get(rl)?);
        let seen = dst_seen.get_mut(if op == XferOp::Read { ll } else { rl })?;
        if std::mem::replace(seen, true) {
            return None;
        }
        // Group 0 moved to this group's layers (`lbase0`, `rbase0` to `lbase`, `rbase`).
        let same = shifted_prefix(
            (lc, &local_idx[..group], lbase.wrapping_sub(lbase0)),
            (rc, &remote_idx[..group], rbase.wrapping_sub(rbase0)),
        );
        if same != group {
            return None;
        }
        local_layers.push(*la);
        remote_layers.push(*ra);
    }
    Some(TableIds {
        local_layers,
        remote_layers,
        runs,
        ids: group,
    })
}

/// Runs `local` and `remote` form (pairs consecutive on both sides merge where `merge`).
#[cfg(test)]
fn run_count(local: &[usize], remote: &[usize], merge: bool) -> usize {
    if !merge {
        return local.len();
    }
    1 + local
        .windows(2)
        .zip(remote.windows(2))
        .filter(|(l, r)| l[1] != l[0].wrapping_add(1) || r[1] != r[0].wrapping_add(1))
        .count()
}

/// Runs of the whole list, for index lists periodic with period `k` whose group 0 forms
/// `group_runs` runs (group `g` is group 0 moved by the same amount `g` times, on each side;
/// `k` divides their length and is below it): each group holds group 0's runs, and a group's
/// last pair continues into the next group's first for every group or for none. Reads one
/// pair past group 0.
fn periodic_runs(
    local: &[usize],
    remote: &[usize],
    (k, group_runs): (usize, usize),
    merge: bool,
) -> usize {
    let groups = local.len() / k;
    let joined = merge
        && local[k] == local[k - 1].wrapping_add(1)
        && remote[k] == remote[k - 1].wrapping_add(1);
    groups * group_runs - if joined { groups - 1 } else { 0 }
}

/// The divisors of `n` in `lo..n`, ascending.
fn divisors(n: usize, lo: usize) -> Vec<usize> {
    let (mut small, mut large) = (Vec::new(), Vec::new());
    let mut d = 1;
    while d * d <= n {
        if n.is_multiple_of(d) {
            small.push(d);
            if d * d != n {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small
        .into_iter()
        .chain(large.into_iter().rev())
        .filter(|&k| k >= lo && k < n)
        .collect()
}

/// Where `idx` first turns: the first `j` with `idx[j + 1] - idx[j]` unlike `idx[1] - idx[0]`
/// (0 where it never does). A list with `idx[i + k] - idx[i]` the same for every `i` has
/// steps periodic with period `k`, so step `j` equals step `j - k`, which for `k <= j` is the
/// first step: no such `k` reaches past a turn at `j`. Reads up to the turn.
fn first_turn(idx: &[usize]) -> usize {
    let [a, b, ..] = idx else {
        return 0;
    };
    const CHUNK: usize = 32;
    let step = b.wrapping_sub(*a);
    let (from, next) = (&idx[..idx.len() - 1], &idx[1..]);
    // Whole chunks without a branch per step, then the turn inside the first that has one.
    let mut i = 0;
    for (f, t) in from.chunks_exact(CHUNK).zip(next.chunks_exact(CHUNK)) {
        // Each step's difference from the first OR-ed together (vectorizes without SSE4.1).
        let turns = f
            .iter()
            .zip(t)
            .fold(0usize, |acc, (&x, &y)| acc | (y.wrapping_sub(x) ^ step));
        if turns != 0 {
            break;
        }
        i += CHUNK;
    }
    let turn = from[i..]
        .iter()
        .zip(&next[i..])
        .position(|(&x, &y)| y.wrapping_sub(x) != step)
        .map_or(0, |j| i + j);
    crate::work::tick(turn + 1);
    turn
}

/// Index lists over two one-layer [`FlatTable`]s (each pool one region: the layers of a KV
/// pool laid out one after another, NIXL's shape for a single allocation) read as a
/// block-table request of virtual layers: where the indices repeat with a period (group `g`
/// is group 0 moved by `g * dl` blocks locally and `g * dr` remotely), each group is a layer
/// of `dl` (`dr`) blocks and the ids are group 0's. Taken only where that costs less than the
/// one layer (layers plus group 0's runs against the whole list's runs): ids already in a few
/// runs stay one layer. The virtual layers are disjoint slices of the region, one per group
/// (so the destination's are distinct). `None` otherwise.
fn period_ids(
    op: XferOp,
    (lt, local_idx): (&FlatTable, &[usize]),
    (rt, remote_idx): (&FlatTable, &[usize]),
    merge: bool,
) -> Option<TableIds> {
    let ([la], [ra]) = (lt.layers.as_slice(), rt.layers.as_slice()) else {
        return None;
    };
    let n = local_idx.len();
    if n != remote_idx.len() || n < 2 * MIN_GROUP {
        return None;
    }
    crate::work::tick(n);
    // The whole list's runs, known once a period is found (they follow from group 0's: no
    // pass over the list of its own, which would be the request's costliest on cold caches).
    let mut flat_runs: Option<usize> = None;
    // Where a period is found but splitting at it costs no less than the one layer: the one
    // layer's runs, group 0's moved to every group (no pass over every pair).
    let mut one_layer: Option<TableIds> = None;
    // No period reaches a side's first turn (a run of equal steps, as consecutive source
    // blocks make, rules out every shorter period: each would fail only at the run's end).
    let shortest = first_turn(local_idx).max(first_turn(remote_idx)) + 1;
    // Index comparisons left: candidate periods that fail late (a list periodic but for its
    // end) cost at most a few passes over the list, never one per divisor.
    let mut budget = 4 * n;
    for k in divisors(n, MIN_GROUP.max(shortest)) {
        let groups = n / k;
        // A split into `groups` layers costs at least `groups + 1`.
        if flat_runs.is_some_and(|f| groups + 1 >= f) {
            continue;
        }
        let (Some(dl), Some(dr)) = (
            local_idx[k].checked_sub(local_idx[0]),
            remote_idx[k].checked_sub(remote_idx[0]),
        ) else {
            continue;
        };
        if dl == 0 || dr == 0 || !lt.per.is_multiple_of(dl) || !rt.per.is_multiple_of(dr) {
            continue;
        }
        let span = (n - k).min(budget);
        let compared = shifted_prefix(
            (&local_idx[k..k + span], &local_idx[..span], dl),
            (&remote_idx[k..k + span], &remote_idx[..span], dr),
        );
        crate::work::tick(compared);
        if compared < n - k {
            budget = budget.saturating_sub(compared + 1);
            if budget == 0 {
                return None;
            }
            continue;
        }
        // Periodic: each group holds group 0's runs, and a group's last pair continues into
        // the next group's first for every group or for none.
        budget = budget.saturating_sub(compared);
        let (lbase, rbase) = (
            local_idx[0] - local_idx[0] % dl,
            remote_idx[0] - remote_idx[0] % dr,
        );
        // The last group inside the table, group 0 inside one virtual layer per side (its
        // runs are checked there, the destination's ids distinct).
        let ends_inside = |base: usize, d: usize, per: usize| {
            groups
                .checked_mul(d)
                .and_then(|span| base.checked_add(span))
                .is_some_and(|end| end <= per)
        };
        if !ends_inside(lbase, dl, lt.per) || !ends_inside(rbase, dr, rt.per) {
            return None;
        }
        let runs = checked_runs(
            op,
            (&local_idx[..k], lbase, dl),
            (&remote_idx[..k], rbase, dr),
            merge,
        )?;
        let whole = periodic_runs(local_idx, remote_idx, (k, runs.len()), merge);
        flat_runs = Some(whole);
        // A split costs the layers plus group 0's runs (its ids moved to its layer keep them).
        if groups + runs.len() >= whole {
            if one_layer.is_none() {
                one_layer = Some(TableIds {
                    local_layers: vec![*la],
                    remote_layers: vec![*ra],
                    runs: moved_runs(&runs, groups, (lbase, dl), (rbase, dr), merge),
                    ids: n,
                });
            }
            continue;
        }
        let layer = |t: &PrepLayer, base: usize, d: usize, g: usize| -> Option<PrepLayer> {
            let mut run = t.run;
            run.addr = run.block_addr((base + g * d) as u64)?;
            run.count = d as u64;
            run.problem().is_none().then_some(PrepLayer {
                run,
                region: t.region,
            })
        };
        let local_layers = (0..groups)
            .map(|g| layer(la, lbase, dl, g))
            .collect::<Option<Vec<_>>>()?;
        let remote_layers = (0..groups)
            .map(|g| layer(ra, rbase, dr, g))
            .collect::<Option<Vec<_>>>()?;
        return Some(TableIds {
            local_layers,
            remote_layers,
            runs,
            ids: k,
        });
    }
    one_layer
}

/// The runs of a list whose group `g` is group 0 (`runs`, ids relative to `lbase` and `rbase`)
/// moved by `g * dl` blocks locally and `g * dr` remotely, in absolute ids of the one layer,
/// merged across groups where `merge` (as a pass over every pair would make them). The caller
/// checked group 0 inside `[base, base + d)` on each side and every group inside the layer, so
/// the groups' ids are disjoint and the ids fit.
fn moved_runs(
    runs: &[BlockRun],
    groups: usize,
    (lbase, dl): (usize, usize),
    (rbase, dr): (usize, usize),
    merge: bool,
) -> Vec<BlockRun> {
    crate::work::tick(groups * runs.len());
    let mut out = Vec::with_capacity(groups * runs.len());
    for g in 0..groups as u64 {
        let (lo, ro) = (lbase as u64 + g * dl as u64, rbase as u64 + g * dr as u64);
        for r in runs {
            push_run(
                &mut out,
                BlockRun::blocks(r.local + lo, r.remote + ro, r.count),
                merge,
            );
        }
    }
    out
}

/// The refusal when no backend took a table with rows rearranged: what each one said.
fn tile_refusal(
    me: &str,
    (local, remote): (&PreparedList, &PreparedList),
    holders: usize,
    refusals: &[(String, Error)],
) -> Error {
    let said = if !refusals.is_empty() {
        let each: Vec<String> = refusals.iter().map(|(n, e)| format!("{n}: {e}")).collect();
        format!(": {}", each.join("; "))
    } else if holders > 0 {
        " (the backends holding both regions cannot rearrange rows)".to_owned()
    } else {
        " (no backend holds both regions)".to_owned()
    };
    Error::not_supported(
        me,
        Op::MakeXfer,
        format!(
            "no backend can move {} -> {} tiles with their rows rearranged (an HND <-> NHD permute or a head gather needs CUDA_IPC's copy kernel or INPROC){said}",
            local.kind, remote.kind
        ),
    )
}

/// Same layer count, block lengths and id counts on both sides, and some ids.
fn check_shapes(
    me: &str,
    ll: &[PrepLayer],
    rl: &[PrepLayer],
    (local_ids, remote_ids): (usize, usize),
) -> Result<()> {
    if ll.len() != rl.len() {
        return Err(Error::mismatch(
            me,
            Op::MakeXfer,
            format!("{} local and {} remote layers", ll.len(), rl.len()),
        ));
    }
    if local_ids != remote_ids {
        return Err(Error::mismatch(
            me,
            Op::MakeXfer,
            format!("{local_ids} local and {remote_ids} remote block ids"),
        ));
    }
    if local_ids == 0 {
        return Err(Error::invalid(me, Op::MakeXfer, "no block ids"));
    }
    for (l, (a, b)) in ll.iter().zip(rl).enumerate() {
        if a.run.len != b.run.len {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                format!(
                    "layer {l}: local blocks of {} bytes, remote of {}",
                    a.run.len, b.run.len
                ),
            ));
        }
    }
    Ok(())
}

/// Each layer's runs with the metadata `slot` has for their regions.
pub(crate) fn layer_pairs(
    me: &str,
    slot: &BackendSlot,
    ll: &[PrepLayer],
    rl: &[PrepLayer],
    local: &PreparedList,
    remote: &PreparedList,
) -> Result<Vec<LayerPair>> {
    let vanished = || Error::not_found(me, Op::MakeXfer, "backend metadata vanished");
    ll.iter()
        .zip(rl)
        .map(|(a, b)| {
            Ok(LayerPair {
                local: a.run,
                local_md: local.regions[a.region as usize]
                    .md(slot.id)
                    .ok_or_else(vanished)?
                    .clone(),
                remote: b.run,
                remote_md: remote.regions[b.region as usize]
                    .md(slot.id)
                    .ok_or_else(vanished)?
                    .clone(),
            })
        })
        .collect()
}

/// Prepares the blocks on `slot`'s backend: strided where it consumes strides, else
/// materialized into segments. Returns the transfer, the spec the request keeps and the
/// path note.
fn prepare_on(
    me: &str,
    slot: &BackendSlot,
    spec: BlockXferSpec,
) -> Result<(Box<dyn BackendXfer>, ReqSpec, PathNote)> {
    match slot.backend.prepare_blocks(&spec)? {
        // Described from the spec the request keeps, when its path is asked for.
        Some(x) => Ok((x, ReqSpec::Blocks(spec), PathNote::Strided)),
        // Rows the backend cannot rearrange are never moved as they lie.
        None if spec.rows.is_some() => Err(Error::not_supported(
            me,
            Op::MakeXfer,
            format!("{} cannot rearrange rows", slot.name),
        )),
        // Segments carry no counters: never drop them silently.
        None if spec.arrival.is_some() => Err(Error::not_supported(
            me,
            Op::MakeXfer,
            format!(
                "{} takes arrival counters only on block tables it consumes as strides",
                slot.name
            ),
        )),
        None => {
            let flat = spec.materialize();
            let note = format!(
                "{}, materialized into {} segments",
                spec.summary(),
                flat.segments.len()
            );
            let x = slot.backend.prepare_xfer(&flat)?;
            Ok((x, ReqSpec::Segments(flat), PathNote::Text(note)))
        }
    }
}

/// Checks every id against the smallest layer: O(ids + layers).
fn check_ids(me: &str, side: &str, ids: &[usize], layers: &[PrepLayer]) -> Result<()> {
    crate::work::tick(ids.len() + layers.len());
    let max = ids.iter().copied().max().unwrap_or(0) as u64;
    let (l, smallest) = layers
        .iter()
        .enumerate()
        .min_by_key(|(_, x)| x.run.count)
        .map(|(l, x)| (l, x.run.count))
        .unwrap_or((0, 0));
    if max >= smallest {
        return Err(Error::invalid(
            me,
            Op::MakeXfer,
            format!("{side} block id {max} out of range (layer {l} has {smallest} blocks)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The main job's shape with consecutive slots on both sides (`disagg_kv --dst-order
    /// sequential`): 4 layers of 2,048 consecutive ids over one region of 4 x 16,384 blocks.
    /// Splitting at the layers is no cheaper than the four runs, so the search answers the
    /// one layer, its runs moved from group 0's: no pass over every pair.
    #[test]
    fn consecutive_slots_in_every_layer_are_four_runs_without_a_pass_per_pair() {
        let (layers, per, ids) = (4usize, 16_384usize, 2_048usize);
        let table = FlatTable {
            layers: vec![PrepLayer {
                run: crate::StridedDesc::new(0x10_0000, 64, 64, (layers * per) as u64),
                region: 0,
            }],
            per: layers * per,
        };
        let idx: Vec<usize> = (0..layers)
            .flat_map(|l| (0..ids).map(move |b| l * per + 100 + b))
            .collect();
        crate::work::take();
        let found = period_ids(XferOp::Read, (&table, &idx), (&table, &idx), true)
            .expect("the period's one layer");
        let ops = crate::work::take();
        assert_eq!((found.local_layers.len(), found.ids), (1, layers * ids));
        let want: Vec<BlockRun> = (0..layers as u64)
            .map(|l| BlockRun::blocks(l * per as u64 + 100, l * per as u64 + 100, ids as u64))
            .collect();
        assert_eq!(found.runs, want);
        // The first turn, the compares and group 0's runs: about three passes over the list,
        // where the pass over every pair cost a fourth of its own on top.
        assert!(ops < 4 * (layers * ids) as u64, "{ops} operations");
    }

    proptest! {
        /// The runs of a periodic list follow from its first group's: the same count as a
        /// pass over the whole list, merged or not, runs crossing groups or not.
        #[test]
        fn periodic_lists_have_their_first_groups_runs(
            group in proptest::collection::vec((0usize..40, 0usize..40), 1..24),
            groups in 2usize..6,
            consecutive in any::<bool>(),
            shift in (1usize..64, 1usize..64),
            merge in any::<bool>(),
        ) {
            let k = group.len();
            // Optionally a group of consecutive pairs, so runs may continue into the next group.
            let group: Vec<(usize, usize)> = if consecutive {
                (0..k).map(|i| (100 + i, 300 + i)).collect()
            } else {
                group
            };
            let (dl, dr) = if consecutive { (k, k) } else { shift };
            let local: Vec<usize> = (0..groups).flat_map(|g| group.iter().map(move |p| p.0 + g * dl)).collect();
            let remote: Vec<usize> = (0..groups).flat_map(|g| group.iter().map(move |p| p.1 + g * dr)).collect();
            let group_runs = run_count(&local[..k], &remote[..k], merge);
            let whole = periodic_runs(&local, &remote, (k, group_runs), merge);
            prop_assert_eq!(whole, run_count(&local, &remote, merge));
            // The one-pass check builds group 0's runs as the count says.
            let base = |v: &[usize]| v[..k].iter().copied().min().unwrap_or(0);
            if let Some(runs) = checked_runs(
                XferOp::Write,
                (&local[..k], base(&local), usize::MAX),
                (&remote[..k], base(&remote), 1 << 16),
                merge,
            ) {
                prop_assert_eq!(runs.len(), group_runs);
            }
        }

        /// Where the ids repeat with a period but splitting at it is no cheaper (runs that
        /// already span groups), the period search answers the one layer with the same runs
        /// as a pass over every pair (`table_ids`), built from group 0's.
        #[test]
        fn an_unsplit_period_gives_the_pass_over_every_pair(
            group in proptest::collection::vec((0usize..16, 0usize..16), 4..12),
            consecutive in any::<bool>(),
            groups in 2usize..6,
            d in 16usize..20,
            read in any::<bool>(),
            merge in any::<bool>(),
        ) {
            let k = group.len();
            let group: Vec<(usize, usize)> = if consecutive {
                (0..k).map(|i| (i, i)).collect()
            } else {
                group
            };
            let d = if consecutive { k } else { d };
            let per = groups * d + 3;
            let table = FlatTable {
                layers: vec![PrepLayer {
                    run: crate::StridedDesc::new(0x10_0000, 64, 64, per as u64),
                    region: 0,
                }],
                per,
            };
            let local: Vec<usize> = (0..groups).flat_map(|g| group.iter().map(move |p| p.0 + g * d)).collect();
            let remote: Vec<usize> = (0..groups).flat_map(|g| group.iter().map(move |p| p.1 + g * d)).collect();
            let op = if read { XferOp::Read } else { XferOp::Write };
            let pass = table_ids(op, (&table, &local), (&table, &remote), merge);
            if let Some(found) = period_ids(op, (&table, &local), (&table, &remote), merge) {
                if found.local_layers.len() == 1 {
                    let pass = pass.expect("the pass takes what the period search took");
                    prop_assert_eq!(found.ids, pass.ids);
                    prop_assert_eq!(found.runs, pass.runs);
                }
            }
        }

        /// Any indices (huge ones, repeats, periodic shapes near the top of `usize`) over
        /// tables of one or several layers: the searches never panic, and what they accept
        /// names blocks inside its layers, the destination's once.
        #[test]
        fn table_searches_take_hostile_indices(
            local in proptest::collection::vec(prop_oneof![0usize..80, (usize::MAX - 90)..=usize::MAX], 8..40),
            shift in prop_oneof![0usize..20, (usize::MAX - 40)..=usize::MAX],
            layers in 1usize..5,
            read in any::<bool>(),
        ) {
            let per = 16usize;
            let table = || FlatTable {
                layers: (0..layers)
                    .map(|l| PrepLayer {
                        run: crate::StridedDesc::new(0x10_0000 + (l * per * 64) as u64, 64, 64, per as u64),
                        region: 0,
                    })
                    .collect(),
                per,
            };
            let (lt, rt) = (table(), table());
            let remote: Vec<usize> = local.iter().map(|&i| i.wrapping_add(shift)).collect();
            let op = if read { XferOp::Read } else { XferOp::Write };
            for found in [
                period_ids(op, (&lt, &local), (&rt, &remote), true),
                table_ids(op, (&lt, &local), (&rt, &remote), true),
            ]
            .into_iter()
            .flatten()
            {
                let mut dst = std::collections::HashSet::new();
                for r in &found.runs {
                    for j in 0..r.count {
                        let (l, m) = (r.local + j, r.remote + j);
                        for (layer_l, layer_r) in found.local_layers.iter().zip(&found.remote_layers) {
                            prop_assert!(l < layer_l.run.count && m < layer_r.run.count);
                        }
                        let d = if read { l } else { m };
                        prop_assert!(dst.insert(d), "destination {} twice", d);
                    }
                }
            }
        }

        /// The one-pass check equals the separate steps it replaces: ids inside the bounds,
        /// the destination's distinct (`check_distinct`), runs as `block_runs` makes them.
        #[test]
        fn checked_runs_are_the_separate_steps(
            pairs in proptest::collection::vec((0usize..48, 0usize..48), 1..64),
            bases in (0usize..3, 0usize..3),
            read in any::<bool>(),
            merge in any::<bool>(),
        ) {
            let (bound, op) = (40, if read { XferOp::Read } else { XferOp::Write });
            let local: Vec<usize> = pairs.iter().map(|p| p.0).collect();
            let remote: Vec<usize> = pairs.iter().map(|p| p.1).collect();
            let got = checked_runs(op, (&local, bases.0, bound), (&remote, bases.1, bound), merge);
            let moved = |v: &[usize], b: usize| -> Option<Vec<usize>> {
                v.iter().map(|&i| i.checked_sub(b).filter(|&x| x < bound)).collect()
            };
            let want = moved(&local, bases.0).zip(moved(&remote, bases.1)).and_then(|(l, r)| {
                let dst = if read { &l } else { &r };
                crate::agent::make::check_distinct("t", "", dst).ok()?;
                Some(block_runs(&l, &r, merge))
            });
            prop_assert_eq!(got, want);
        }

        /// A list periodic with period `k` turns before `k` (or never): the search's lower
        /// bound never rules out a true period, for groups of any shape, runs of equal steps
        /// included.
        #[test]
        fn no_period_reaches_past_a_turn(
            group in proptest::collection::vec(0usize..64, 1..40),
            stepped in proptest::option::of((0usize..1000, 0usize..5)),
            groups in 2usize..6,
            shift in 0usize..5000,
        ) {
            // Optionally a group of equal steps (consecutive blocks, or a stride).
            let group: Vec<usize> = match stepped {
                Some((start, step)) => (0..group.len()).map(|i| start + i * step).collect(),
                None => group,
            };
            let k = group.len();
            let list: Vec<usize> = (0..groups).flat_map(|g| group.iter().map(move |&x| x + g * shift)).collect();
            let turn = first_turn(&list);
            prop_assert!(turn == 0 || turn < k, "turn {} for period {}", turn, k);
            for i in 0..list.len() - k {
                prop_assert_eq!(list[i + k] - list[i], list[k] - list[0]);
            }
        }
    }
}
