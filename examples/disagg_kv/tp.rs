//! `--tp P:D`: prefill at tensor-parallel size P and decode at D, each rank an agent with its
//! own paged KV pool described by a [`KvLayout`] (`--kv-order`, `--block-tokens P:D`,
//! `--kv-heads`, `--head-dim`, `--layers`); the two processes exchange the layouts as bytes in
//! notifications, and each rank posts what the planner gives it: decode ranks read their heads
//! (`--op read`), or prefill ranks write them (`--op write`). Decode checks every element
//! (layer, K/V, token, head, dim) of every request against the value prefill computed for it.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::kv::{KvLayout, KvOrder, KvPeer, KvTensor};
use nixl::ucx::UcxParams;
use nixl::{Agent, HostBuffer, XferOp, XferOptions};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// What the TP mode needs from the command line.
#[derive(Debug, Clone)]
pub(crate) struct TpOpts {
    pub tp: (u32, u32),
    pub block_tokens: (u32, u32),
    pub order: KvOrder,
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub tokens: u64,
    pub requests: u64,
    pub op: XferOp,
    pub tls: Option<String>,
    pub timeout: Duration,
    /// Decode's view: the prefill ranks' side channels.
    pub peers: Vec<SocketAddr>,
}

/// Bytes per element (bf16).
const ELEM: u32 = 2;

/// The element a prefill rank computes for (request, layer, tensor, token, head, dim).
fn value(req: u64, layer: u32, tensor: u32, token: u64, head: u32, d: u32) -> u16 {
    let x = (req << 56)
        ^ (u64::from(layer) << 48)
        ^ (u64::from(tensor) << 44)
        ^ (token << 20)
        ^ (u64::from(head) << 12)
        ^ u64::from(d);
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as u16
}

fn blocks_per_request(o: &TpOpts, tokens_per_block: u32) -> u64 {
    o.tokens.div_ceil(u64::from(tokens_per_block))
}

/// Request `q`'s block ids on a side: prefill's from the end of its pool, decode's from the
/// start, so the two sides' ids differ.
fn ids(o: &TpOpts, q: u64, prefill: bool) -> Vec<u64> {
    let b = if prefill {
        o.block_tokens.0
    } else {
        o.block_tokens.1
    };
    let n = blocks_per_request(o, b);
    let pool = n * o.requests;
    (0..n)
        .map(|i| {
            let k = q * n + i;
            if prefill {
                pool - 1 - k
            } else {
                k
            }
        })
        .collect()
}

/// One rank: its agent, pool and layout.
struct Rank {
    agent: Agent,
    pool: Arc<HostBuffer>,
    layout: KvLayout,
    _reg: nixl::Registration,
}

fn rank(o: &TpOpts, prefill: bool, r: u32) -> Res<Rank> {
    let (role, tp, b) = if prefill {
        ("prefill", o.tp.0, o.block_tokens.0)
    } else {
        ("decode", o.tp.1, o.block_tokens.1)
    };
    let agent = Agent::new(
        &format!("{role}-{r}"),
        nixl::agent_config()
            .listen(prefill)
            .default_timeout(o.timeout),
    )?;
    agent.create_backend(UcxParams::default().transports(o.tls.clone()))?;
    let blocks = blocks_per_request(o, b) * o.requests;
    let model = format!("disagg-kv-{}x{}x{}", o.layers, o.kv_heads, o.head_dim);
    let mut layout = KvLayout::new(model, o.layers, b, o.kv_heads, o.head_dim, ELEM)
        .order(o.order)
        .tp(r, tp)
        .blocks(blocks);
    let bb = layout.block_bytes();
    let tensors = u64::from(o.layers) * 2;
    let pool = Arc::new(
        HostBuffer::new((tensors * blocks * bb) as usize).ok_or("allocating the KV pool")?,
    );
    layout.tensors = (0..tensors)
        .map(|i| KvTensor {
            base: pool.addr() + i * blocks * bb,
            block_stride: bb,
        })
        .collect();
    layout.validate()?;
    let reg = agent.register_mem(vec![pool.clone()], &[])?;
    Ok(Rank {
        agent,
        pool,
        layout,
        _reg: reg,
    })
}

/// Calls `f(byte offset in the pool, value)` for every element of request `q` a rank holds.
fn each_element(
    o: &TpOpts,
    l: &KvLayout,
    q: u64,
    block_ids: &[u64],
    mut f: impl FnMut(usize, u16),
) {
    let (first, _) = l.head_range();
    let b = u64::from(l.tokens_per_block);
    let (h, dim) = (u64::from(l.kv_heads), u64::from(l.head_dim));
    let base = l.tensors[0].base;
    for (ti, t) in l.tensors.iter().enumerate() {
        let (layer, tensor) = (ti as u32 / 2, ti as u32 % 2);
        for tok in 0..o.tokens {
            let blk = t.base - base + block_ids[(tok / b) as usize] * t.block_stride;
            let slot = tok % b;
            for hl in 0..h {
                for d in 0..dim {
                    let inner = match l.order {
                        KvOrder::Nhd => (slot * h + hl) * dim + d,
                        KvOrder::Hnd => (hl * b + slot) * dim + d,
                    };
                    let v = value(q, layer, tensor, tok, first + hl as u32, d as u32);
                    f((blk + inner * u64::from(ELEM)) as usize, v);
                }
            }
        }
    }
}

/// Notifications per (agent, sender), kept across reads.
#[derive(Default)]
struct Mail(HashMap<(String, String), VecDeque<Vec<u8>>>);

impl Mail {
    /// The next notification from `from` to `a` starting with `prefix`.
    fn next(&mut self, a: &Agent, from: &str, prefix: &str, timeout: Duration) -> Res<String> {
        let end = Instant::now() + timeout;
        let key = (a.name().to_owned(), from.to_owned());
        loop {
            if let Some(q) = self.0.get_mut(&key) {
                if let Some(i) = q.iter().position(|m| m.starts_with(prefix.as_bytes())) {
                    let m = q.remove(i).unwrap_or_default();
                    return Ok(String::from_utf8(m)?);
                }
            }
            if Instant::now() >= end {
                return Err(
                    format!("{}: no {prefix:?} from {from} within {timeout:?}", a.name()).into(),
                );
            }
            for (sender, msgs) in a.wait_notifs(Duration::from_millis(50))? {
                self.0
                    .entry((a.name().to_owned(), sender))
                    .or_default()
                    .extend(msgs);
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Res<Vec<u8>> {
    (0..s.len() / 2)
        .map(|i| {
            Ok(u8::from_str_radix(
                s.get(2 * i..2 * i + 2).ok_or("hex")?,
                16,
            )?)
        })
        .collect()
}

fn layout_of(msg: &str) -> Res<KvLayout> {
    let h = msg
        .split(' ')
        .nth(1)
        .ok_or("a layout message without bytes")?;
    Ok(KvLayout::decode(&unhex(h)?)?)
}

/// The prefill process: P ranks, the decode process started beside it.
pub(crate) fn prefill(o: &TpOpts) -> Res<()> {
    let ranks: Vec<Rank> = (0..o.tp.0).map(|r| rank(o, true, r)).collect::<Res<_>>()?;
    // "Compute" every request's KV: each rank writes the values of its heads.
    for r in &ranks {
        let mut bytes = vec![0u8; r.pool.len()];
        for q in 0..o.requests {
            each_element(o, &r.layout, q, &ids(o, q, true), |at, v| {
                bytes[at..at + 2].copy_from_slice(&v.to_le_bytes())
            });
        }
        if !r.pool.write_at(0, &bytes) {
            return Err("filling the prefill pool".into());
        }
    }
    let addrs: Vec<String> = ranks
        .iter()
        .map(|r| {
            r.agent
                .listen_addr()
                .map(|a| a.to_string())
                .ok_or("no side channel")
        })
        .collect::<std::result::Result<_, _>>()?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.extend([
        "--role".into(),
        "decode".into(),
        "--peers".into(),
        addrs.join(","),
    ]);
    let mut child = Command::new(std::env::current_exe()?)
        .args(&args)
        .stdin(Stdio::null())
        .spawn()?;
    let result = prefill_run(o, &ranks);
    if result.is_err() {
        let _ = child.kill();
    }
    let status = child.wait()?;
    result?;
    if !status.success() {
        return Err(format!("decode failed: {status}").into());
    }
    println!("prefill: done");
    Ok(())
}

fn prefill_run(o: &TpOpts, ranks: &[Rank]) -> Res<()> {
    let mut mail = Mail::default();
    // Each decode rank introduces itself (metadata pushed, then its layout) to every rank.
    let mut decode: Vec<(String, KvLayout)> = Vec::new();
    for d in 0..o.tp.1 {
        let name = format!("decode-{d}");
        let mut layout = None;
        for r in ranks {
            let m = mail.next(&r.agent, &name, "hello ", o.timeout)?;
            let l = layout_of(&m)?;
            r.layout.check_compatible(&l)?;
            r.agent.gen_notif(
                &name,
                format!("layout {}", hex(&r.layout.encode())).as_bytes(),
                &[],
            )?;
            layout = Some(l);
        }
        decode.push((name, layout.ok_or("no prefill rank")?));
    }
    if o.op == XferOp::Write {
        let side: Vec<(&str, &KvLayout)> = decode.iter().map(|(n, l)| (n.as_str(), l)).collect();
        for q in 0..o.requests {
            let theirs = ids(o, q, false);
            let peers = kv_peers(&side, &theirs);
            for r in ranks {
                let plan = r
                    .layout
                    .plan(XferOp::Write, &ids(o, q, true), &peers, o.tokens)?;
                let opts = XferOptions::with_notif(format!("req {q}").into_bytes());
                for req in r.agent.make_kv_xfers(&plan, &opts)? {
                    r.agent.post_xfer_req(&req)?;
                    req.wait(o.timeout)?;
                }
            }
        }
    }
    for (name, _) in &decode {
        for r in ranks {
            let m = mail.next(&r.agent, name, "done ", o.timeout * 4)?;
            if m != "done ok" {
                return Err(format!("{name}: {m}").into());
            }
        }
    }
    Ok(())
}

/// The decode process: D ranks that pull (or receive) and check every request.
pub(crate) fn decode(o: &TpOpts) -> Res<()> {
    if o.peers.len() != o.tp.0 as usize {
        return Err(format!(
            "--peers names {} prefill ranks, --tp says {}",
            o.peers.len(),
            o.tp.0
        )
        .into());
    }
    let ranks: Vec<Rank> = (0..o.tp.1).map(|r| rank(o, false, r)).collect::<Res<_>>()?;
    let mut mail = Mail::default();
    // Every rank introduces itself to every prefill rank first, then collects their layouts
    // (prefill answers each hello as it comes).
    for (p, addr) in o.peers.iter().enumerate() {
        let name = format!("prefill-{p}");
        for r in &ranks {
            r.agent
                .fetch_remote_metadata_blocking(&name, *addr, o.timeout)?;
            r.agent.send_local_metadata(*addr)?;
            r.agent.gen_notif(
                &name,
                format!("hello {}", hex(&r.layout.encode())).as_bytes(),
                &[],
            )?;
        }
    }
    let mut prefill: Vec<(String, KvLayout)> = Vec::new();
    for p in 0..o.peers.len() {
        let name = format!("prefill-{p}");
        let mut layout = None;
        for r in &ranks {
            let l = layout_of(&mail.next(&r.agent, &name, "layout ", o.timeout)?)?;
            r.layout.check_compatible(&l)?;
            layout = Some(l);
        }
        prefill.push((name, layout.ok_or("no decode rank")?));
    }
    let side: Vec<(&str, &KvLayout)> = prefill.iter().map(|(n, l)| (n.as_str(), l)).collect();
    let outcome = decode_run(o, &ranks, &side, &mut mail);
    let msg = match &outcome {
        Ok(()) => "done ok".to_owned(),
        Err(e) => format!("done error: {e}"),
    };
    for r in &ranks {
        for (name, _) in &prefill {
            let _ = r.agent.gen_notif(name, msg.as_bytes(), &[]);
        }
    }
    outcome
}

/// The other side's ranks, each at the request's `blocks` there.
fn kv_peers<'a>(side: &[(&'a str, &'a KvLayout)], blocks: &'a [u64]) -> Vec<KvPeer<'a>> {
    side.iter()
        .map(|&(name, layout)| KvPeer {
            name,
            layout,
            blocks,
        })
        .collect()
}

fn decode_run(o: &TpOpts, ranks: &[Rank], side: &[(&str, &KvLayout)], mail: &mut Mail) -> Res<()> {
    let (mut bytes, mut busy, mut pieces) = (0u64, Duration::ZERO, 0usize);
    for q in 0..o.requests {
        let (pids, dids) = (ids(o, q, true), ids(o, q, false));
        let peers = kv_peers(side, &pids);
        for r in ranks {
            let plan = r.layout.plan(XferOp::Read, &dids, &peers, o.tokens)?;
            bytes += plan.bytes();
            pieces += plan.pieces();
            let t0 = Instant::now();
            if o.op == XferOp::Read {
                let reqs = r.agent.make_kv_xfers(&plan, &XferOptions::default())?;
                for req in &reqs {
                    r.agent.post_xfer_req(req)?;
                }
                for req in &reqs {
                    req.wait(o.timeout)?;
                }
            } else {
                // The prefill ranks that hold this rank's heads write them, then notify.
                for t in &plan.transfers {
                    mail.next(&r.agent, &t.peer, &format!("req {q}"), o.timeout)?;
                }
            }
            busy += t0.elapsed();
            check(o, r, q, &dids)?;
        }
    }
    println!(
        "decode: {} requests x {} ranks, TP {}:{} {:?}, {} tokens of {} layers x {} heads x {} dims, blocks of {}:{} tokens: every element verified",
        o.requests, ranks.len(), o.tp.0, o.tp.1, o.order, o.tokens, o.layers, o.kv_heads, o.head_dim, o.block_tokens.0, o.block_tokens.1
    );
    println!(
        "decode: {:?} moved {} bytes in {} pieces, {:.2} GB/s while transferring",
        o.op,
        bytes,
        pieces,
        bytes as f64 / busy.as_secs_f64().max(1e-9) / 1e9
    );
    Ok(())
}

fn check(o: &TpOpts, r: &Rank, q: u64, dids: &[u64]) -> Res<()> {
    let got = r.pool.to_vec();
    let mut bad = None;
    each_element(o, &r.layout, q, dids, |at, want| {
        let have = u16::from_le_bytes([got[at], got[at + 1]]);
        if have != want && bad.is_none() {
            bad = Some(at);
        }
    });
    match bad {
        Some(at) => Err(format!(
            "{}: request {q}: byte {at} of the pool differs",
            r.agent.name()
        )
        .into()),
        None => Ok(()),
    }
}
