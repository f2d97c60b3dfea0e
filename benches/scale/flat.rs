//! Flat mode: per-step cost per descriptor of descriptor-list requests, 1k to 128k.

use std::time::{Duration, Instant};

use nixl::{Agent, XferDescList, XferOp, XferOptions, XferState, XferTarget};

use super::{agents, run, shuffle, side, Opts, Res, Side, Which};

/// Bytes written to evict the caches with `--cold` (above any LLC of the machines measured).
const EVICT: usize = 64 << 20;

const STEPS: [&str; 7] = ["prep", "make", "post", "done", "repost", "fresh", "drop"];

/// One size, set up once (fields drop in order: requests and lists before their memory).
struct Point {
    n: usize,
    req: nixl::XferReq,
    l: nixl::PreparedList,
    r: nixl::PreparedList,
    lidx: Vec<usize>,
    ridx: Vec<usize>,
    ldescs: XferDescList,
    rdescs: XferDescList,
    remote: String,
    _sides: (Side, Side),
    a: Agent,
    _b: Agent,
    /// The best time per step.
    best: [Duration; 7],
    /// Written before each timed step with `--cold` (empty otherwise).
    evict: Vec<u8>,
}

impl Point {
    fn new(which: Which, o: &Opts, n: usize) -> Res<Self> {
        let (a, b) = agents(which, &format!("flat{n}"))?;
        let kind = which.kind();
        let len = n as u64 * o.block;
        let regions = o.regions.min(n);
        let la = side(&a, which, len, regions, o.block)?;
        let lb = side(&b, which, len, regions, o.block)?;
        a.load_remote_metadata(&b.local_metadata()?)?;
        let remote = b.name().to_owned();
        let ldescs = XferDescList::blocks(kind, la.base, o.block, n);
        let (rdescs, lidx, ridx) = if o.order == "layers" {
            let layers = regions * o.layers.max(1);
            if !n.is_multiple_of(layers) {
                return Err(format!(
                    "--order layers: {n} descriptors over {regions} regions of {} layers",
                    o.layers
                )
                .into());
            }
            let per = n / layers;
            let (lids, rids) = if o.ids == "engine" {
                engine_ids(per)
            } else {
                (shuffle(per), shuffle(per))
            };
            let across = |ids: &[usize]| -> Vec<usize> {
                (0..layers)
                    .flat_map(|l| ids.iter().map(move |&i| l * per + i))
                    .collect()
            };
            let (lidx, ridx) = (across(&lids), across(&rids));
            (XferDescList::blocks(kind, lb.base, o.block, n), lidx, ridx)
        } else {
            let shuffled = XferDescList::from_descs(
                kind,
                shuffle(n)
                    .iter()
                    .map(|&p| nixl::Desc::new(lb.base + p as u64 * o.block, o.block)),
            );
            (shuffled, (0..n).collect(), (0..n).collect())
        };
        let l = a.prep_xfer_dlist(XferTarget::Initiator, &ldescs, &[])?;
        let r = a.prep_xfer_dlist(XferTarget::Agent(&remote), &rdescs, &[])?;
        let req =
            a.make_prepped_xfer(XferOp::Write, &l, &lidx, &r, &ridx, XferOptions::default())?;
        if !o.json {
            println!(
                "# flat {} ({}), {n} descriptors: {}",
                which.name(),
                o.order,
                req.path()
            );
        }
        run(&a, &req)?; // first touch of the pages
        Ok(Point {
            n,
            req,
            l,
            r,
            lidx,
            ridx,
            ldescs,
            rdescs,
            remote,
            _sides: (la, lb),
            a,
            _b: b,
            best: [Duration::MAX; 7],
            evict: if o.cold { vec![0; EVICT] } else { Vec::new() },
        })
    }

    /// With `--cold`, writes the eviction buffer (one byte per cache line), so the next step
    /// finds the CPU caches holding none of its data.
    fn chill(&mut self) {
        for (i, b) in self.evict.iter_mut().step_by(64).enumerate() {
            *b = b.wrapping_add(i as u8);
        }
        std::hint::black_box(&self.evict);
    }

    fn note(&mut self, step: usize, d: Duration) {
        self.best[step] = self.best[step].min(d);
    }

    fn make(&self) -> nixl::Result<nixl::XferReq> {
        self.a.make_prepped_xfer(
            XferOp::Write,
            &self.l,
            &self.lidx,
            &self.r,
            &self.ridx,
            XferOptions::default(),
        )
    }

    /// One round: every step `cpu` times (data-moving steps `data` times).
    fn round(&mut self, cpu: usize, data: usize) -> Res<()> {
        let a = self.a.clone();
        for _ in 0..cpu {
            self.chill();
            let t = Instant::now();
            let l = a.prep_xfer_dlist(XferTarget::Initiator, &self.ldescs, &[])?;
            let r = a.prep_xfer_dlist(XferTarget::Agent(&self.remote), &self.rdescs, &[])?;
            self.note(0, t.elapsed());
            drop((l, r));
            self.chill();
            let t = Instant::now();
            let q = self.make()?;
            self.note(1, t.elapsed());
            let t = Instant::now();
            drop(q);
            self.note(6, t.elapsed());
        }
        for _ in 0..data {
            self.chill();
            let t = Instant::now();
            let mut st = a.post_xfer_req(&self.req)?;
            self.note(2, t.elapsed());
            let end = Instant::now() + Duration::from_secs(60);
            while st == XferState::InProgress && Instant::now() < end {
                st = a.check_xfer_state(&self.req)?;
            }
            self.note(3, t.elapsed());
            let t = Instant::now();
            run(&a, &self.req)?;
            self.note(4, t.elapsed());
            let t = Instant::now();
            let q = self.make()?;
            run(&a, &q)?;
            drop(q);
            self.note(5, t.elapsed());
        }
        Ok(())
    }

    fn per_desc(&self) -> [f64; 7] {
        self.best.map(|d| d.as_nanos() as f64 / self.n as f64)
    }
}

/// A layer's ids as the main job's block manager hands them out (`disagg_kv`'s tables for
/// one request covering the layer): the source's blocks in order, the destination's slots
/// at a stride of about half the layer (coprime with it where it is a power of two).
fn engine_ids(per: usize) -> (Vec<usize>, Vec<usize>) {
    let stride = (per / 2 + 1) | 1;
    let mut seen = vec![false; per];
    let dst = (0..per)
        .map(|k| {
            let mut d = (k * stride) % per;
            while seen[d] {
                d = (d + 1) % per;
            }
            seen[d] = true;
            d
        })
        .collect();
    ((0..per).collect(), dst)
}

/// Runs the flat sweep on one backend and prints the table.
pub(crate) fn sweep(which: Which, o: &Opts) -> Res<()> {
    let mut points = Vec::new();
    for &n in &o.descs {
        points.push(Point::new(which, o, n)?);
    }
    for _ in 0..o.rounds {
        for p in &mut points {
            let per = if o.iters > 0 {
                o.iters
            } else {
                (400_000 / p.n).clamp(1, 40)
            };
            let data = if which == Which::Null {
                per
            } else {
                per.div_ceil(4)
            };
            p.round(per, data)?;
        }
    }
    let rows: Vec<(usize, [f64; 7])> = points.iter().map(|p| (p.n, p.per_desc())).collect();
    print(which, o, &rows);
    Ok(())
}

fn print(which: Which, o: &Opts, rows: &[(usize, [f64; 7])]) {
    if !o.json {
        println!(
            "# flat {} ({}{}): {} B descriptors over {} regions per side; ns per descriptor, best of {} interleaved rounds",
            which.name(),
            o.order,
            if o.order == "layers" {
                format!(", {} ids, {} layers per region", o.ids, o.layers)
            } else {
                String::new()
            },
            o.block,
            o.regions,
            o.rounds
        );
        print!("{:>8}", "descs");
        for s in STEPS {
            print!(" {s:>9}");
        }
        println!();
    }
    for (n, row) in rows {
        if o.json {
            let fields: Vec<String> = STEPS
                .iter()
                .zip(row)
                .map(|(s, v)| format!("\"{s}_ns\": {v:.2}"))
                .collect();
            println!(
                "{{\"bench\": \"scale\", \"mode\": \"flat\", \"order\": \"{}\", \"backend\": \"{}\", \"descs\": {n}, \"block\": {}, {}}}",
                o.order,
                which.name(),
                o.block,
                fields.join(", ")
            );
        } else {
            print!("{n:>8}");
            for v in row {
                print!(" {v:>9.1}");
            }
            println!();
        }
    }
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return;
    };
    if rows.len() < 2 {
        return;
    }
    let lin: Vec<f64> = (0..STEPS.len())
        .map(|i| last.1[i] / first.1[i].max(1e-9))
        .collect();
    if o.json {
        let fields: Vec<String> = STEPS
            .iter()
            .zip(&lin)
            .map(|(s, v)| format!("\"{s}\": {v:.2}"))
            .collect();
        println!(
            "{{\"bench\": \"scale\", \"mode\": \"linearity\", \"backend\": \"{}\", \"from\": {}, \"to\": {}, {}}}",
            which.name(),
            first.0,
            last.0,
            fields.join(", ")
        );
    } else {
        print!("{:>8}", "ratio");
        for v in lin {
            print!(" {v:>9.2}");
        }
        println!("   <- linearity: ns/desc at {} over at {}", last.0, first.0);
    }
}
