//! KV layouts over UCX between processes (issue 26): each prefill rank is its own process
//! (this test binary spawned again), with its pool filled and its layout sent to the decode
//! side as bytes (`KvLayout::encode` in a notification); the decode ranks, agents of this
//! process or each its own process too, check the description, plan their reads and pull over
//! UCX tcp. Every element of the request is compared with its value computed from (layer,
//! tensor, token, head, dim), and every byte outside the request must be unchanged. A tile
//! request (rows rearranged) over UCX is refused typed: UCX moves bytes as they lie.
// This file also checks the per-form KV entries (`plan_read`, `plan_write`, `plan_read_tiles`,
// `plan_write_tiles`), deprecated for `KvLayout::plan` but kept for one release: they must go
// on moving the same bytes.
#![allow(deprecated)]

use std::sync::Arc;
use std::time::Duration;

use nixl::kv::{KvLayout, KvOrder};
use nixl::{Agent, AgentConfig, ErrorKind, HostBuffer, XferOptions, XferTarget};
use nixl_testkit::kv::{
    check_destination, ids_for, parse_ready, pool_layout, pool_len, ready_message, source_bytes,
    KvShape,
};
use nixl_testkit::two_process::{child_main, Child};
use nixl_testkit::ucx::{params, ucx_or_skip, TCP};

const ENTRY: &str = "kv_prefill_rank";
const DECODE_ENTRY: &str = "kv_decode_rank";
const DEADLINE: Duration = Duration::from_secs(60);
const POOL: u64 = 12;

fn shape(mla: bool) -> KvShape {
    KvShape {
        layers: 2,
        heads: if mla { 1 } else { 8 },
        dim: if mla { 32 } else { 16 },
        mla,
        blocks: POOL,
    }
}

fn order_of(s: &str) -> KvOrder {
    if s == "hnd" {
        KvOrder::Hnd
    } else {
        KvOrder::Nhd
    }
}

fn agent(name: &str) -> Agent {
    let a = Agent::new(
        name,
        AgentConfig::default()
            .listen(true)
            .default_timeout(Duration::from_secs(20)),
    )
    .expect("agent");
    a.create_backend(params(TCP)).expect("UCX backend");
    a
}

#[test]
#[ignore = "child process entry point: spawned (with --ignored) by the tests of this file"]
fn kv_prefill_rank() {
    child_main(|env| {
        let num = |k: &str| -> Result<u64, String> {
            env.var(k)?.parse().map_err(|e| format!("{k}: {e}"))
        };
        let (tp, rank, block, tokens) = (num("tp")?, num("rank")?, num("block")?, num("tokens")?);
        let s = shape(env.var("mla")? == "1");
        let a = agent(&env.name);
        let buf =
            Arc::new(HostBuffer::new(pool_len(s, tp as u32, block as u32, 0)).ok_or("alloc")?);
        let layout = pool_layout(
            s,
            tp as u32,
            rank as u32,
            block as u32,
            order_of(&env.var("order")?),
            0,
            buf.addr(),
        );
        let ids = ids_for(tokens, block as u32, 3, POOL);
        if !buf.write_at(0, &source_bytes(&layout, buf.len(), &ids, tokens)) {
            return Err("fill".into());
        }
        let _reg = a
            .register_mem(vec![buf.clone()], &[])
            .map_err(|e| e.to_string())?;
        env.connect(&a, Duration::from_secs(20))?;
        let addr = a.listen_addr().ok_or("no side channel")?;
        a.gen_notif(&env.parent, &ready_message(addr, &layout), &[])
            .map_err(|e| e.to_string())?;
        while env.parent_alive() {
            a.progress();
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    });
}

/// A decode rank in its own process: loads each prefill rank's metadata (`peers`: `name addr
/// layout-hex` per line), plans its reads, pulls, checks every element of its pool and
/// answers `ok` or what was wrong.
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by the tests of this file"]
fn kv_decode_rank() {
    child_main(|env| {
        let num = |k: &str| -> Result<u64, String> {
            env.var(k)?.parse().map_err(|e| format!("{k}: {e}"))
        };
        let (tp, rank, block, tokens) = (num("tp")?, num("rank")?, num("block")?, num("tokens")?);
        let s = shape(env.var("mla")? == "1");
        let a = agent(&env.name);
        let buf =
            Arc::new(HostBuffer::new(pool_len(s, tp as u32, block as u32, 0)).ok_or("alloc")?);
        buf.fill(0xDD);
        let l = pool_layout(
            s,
            tp as u32,
            rank as u32,
            block as u32,
            order_of(&env.var("order")?),
            0,
            buf.addr(),
        );
        let _reg = a
            .register_mem(vec![buf.clone()], &[])
            .map_err(|e| e.to_string())?;
        env.connect(&a, Duration::from_secs(20))?;
        let mut prefill: Vec<(String, KvLayout)> = Vec::new();
        for line in env.var("peers")?.lines() {
            let mut it = line.split(' ');
            let (name, addr, hex) = (
                it.next().ok_or("name")?,
                it.next().ok_or("addr")?.parse().map_err(|_| "addr")?,
                it.next().ok_or("layout")?,
            );
            a.fetch_remote_metadata_blocking(name, addr, DEADLINE)
                .map_err(|e| e.to_string())?;
            let layout = KvLayout::decode(&nixl_testkit::unhex(hex)).map_err(|e| e.to_string())?;
            prefill.push((name.to_owned(), layout));
        }
        let side: Vec<(&str, &KvLayout)> = prefill.iter().map(|(n, l)| (n.as_str(), l)).collect();
        let pblock = prefill.first().map_or(16, |p| p.1.tokens_per_block);
        let (sids, dids) = (
            ids_for(tokens, pblock, 3, POOL),
            ids_for(tokens, block as u32, 7, POOL),
        );
        let plan = l
            .plan_read(&side, &sids, &dids, tokens)
            .map_err(|e| e.to_string())?;
        for t in &plan.transfers {
            let req = a
                .create_xfer_req(
                    plan.op,
                    &t.local,
                    &t.remote,
                    &t.peer,
                    XferOptions::default(),
                )
                .map_err(|e| e.to_string())?;
            a.post_xfer_req(&req).map_err(|e| e.to_string())?;
            req.wait(DEADLINE).map_err(|e| e.to_string())?;
        }
        let verdict = match check_destination(&l, &buf.to_vec(), &dids, tokens) {
            Ok(()) => format!(
                "ok {} bytes from {} ranks",
                plan.bytes(),
                plan.transfers.len()
            ),
            Err(e) => format!("wrong: {e}"),
        };
        a.gen_notif(&env.parent, verdict.as_bytes(), &[])
            .map_err(|e| e.to_string())?;
        while env.parent_alive() {
            a.progress();
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    });
}

/// Prefill TP `tp.0` and decode TP `tp.1`, every rank its own process; this process only
/// starts them, hands the decode ranks the prefill ranks' addresses and layouts, and collects
/// each decode rank's verdict. It also asks UCX for a tile request (an HND -> NHD permute):
/// refused typed, nothing moved.
fn run_processes(test: &str, tp: (u32, u32), block: (u32, u32), order: &str, tokens: u64) {
    if !ucx_or_skip(test) {
        return;
    }
    let pid = std::process::id();
    let parent = agent(&format!("{test}-host-{pid}"));
    let mut children = Vec::new();
    let mut peers = String::new();
    let mut layouts = Vec::new();
    for r in 0..tp.0 {
        let v = [
            ("tp", tp.0.to_string()),
            ("rank", r.to_string()),
            ("block", block.0.to_string()),
            ("tokens", tokens.to_string()),
            ("order", order.to_owned()),
            ("mla", "0".to_owned()),
        ];
        let v: Vec<(&str, &str)> = v.iter().map(|(k, x)| (*k, x.as_str())).collect();
        let mut c = Child::spawn(ENTRY, &parent, &format!("{test}-p{r}-{pid}"), &v).expect("spawn");
        let (addr, layout) = parse_ready(&c.next(&parent, DEADLINE).expect("ready"));
        peers += &format!(
            "{} {addr} {}\n",
            c.name(),
            nixl_testkit::hex(&layout.encode())
        );
        parent
            .fetch_remote_metadata_blocking(c.name(), addr, DEADLINE)
            .expect("fetch");
        layouts.push((c.name().to_owned(), layout));
        children.push(c);
    }
    tiles_are_refused(&parent, &layouts);
    let mut decode = Vec::new();
    for r in 0..tp.1 {
        let v = [
            ("tp", tp.1.to_string()),
            ("rank", r.to_string()),
            ("block", block.1.to_string()),
            ("tokens", tokens.to_string()),
            ("order", order.to_owned()),
            ("mla", "0".to_owned()),
            ("peers", peers.trim_end().to_owned()),
        ];
        let v: Vec<(&str, &str)> = v.iter().map(|(k, x)| (*k, x.as_str())).collect();
        decode.push(
            Child::spawn(DECODE_ENTRY, &parent, &format!("{test}-d{r}-{pid}"), &v).expect("spawn"),
        );
    }
    for c in &mut decode {
        let verdict = String::from_utf8(c.next(&parent, DEADLINE).expect("a verdict")).unwrap();
        assert!(verdict.starts_with("ok "), "{}: {verdict}", c.name());
    }
    drop(decode);
    drop(children);
}

/// A tile request to a UCX peer: `NotSupported` naming the rearrangement.
fn tiles_are_refused(a: &Agent, peers: &[(String, KvLayout)]) {
    let (peer, layout) = &peers[0];
    let side: Vec<(&str, &KvLayout)> = peers.iter().map(|(n, l)| (n.as_str(), l)).collect();
    let buf = Arc::new(
        HostBuffer::new(pool_len(
            shape(false),
            layout.tp_size,
            layout.tokens_per_block,
            0,
        ))
        .expect("alloc"),
    );
    let mut mine = layout.clone();
    mine.order = if layout.order == KvOrder::Hnd {
        KvOrder::Nhd
    } else {
        KvOrder::Hnd
    };
    mine.tp_rank = 0;
    let _reg = a.register_mem(vec![buf.clone()], &[]).expect("register");
    for (t, m) in mine.tensors.iter_mut().zip(
        pool_layout(
            shape(false),
            layout.tp_size,
            0,
            layout.tokens_per_block,
            mine.order,
            0,
            buf.addr(),
        )
        .tensors,
    ) {
        *t = m;
    }
    let ids: Vec<u64> = (0..2).collect();
    let plan = mine
        .plan_read_tiles(&side, &ids, &ids, 2 * u64::from(layout.tokens_per_block))
        .expect("a tile plan");
    let local = a
        .prep_strided_dlist(XferTarget::Initiator, &mine.block_table(), &[])
        .expect("prep");
    let remote = a
        .prep_strided_dlist(XferTarget::Agent(peer), &layout.block_table(), &[])
        .expect("prep");
    let t = &plan.transfers[0];
    let e = a
        .make_tile_xfer(
            plan.op,
            &local,
            &remote,
            &t.shape,
            &t.tiles,
            XferOptions::default(),
        )
        .expect_err("UCX cannot rearrange rows");
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    assert!(e.to_string().contains("rearrange"), "{e}");
}

/// Prefill TP `tp.0` (one process per rank) -> decode TP `tp.1` (agents of this process).
fn run(test: &str, tp: (u32, u32), block: (u32, u32), order: &str, mla: bool, tokens: u64) {
    if !ucx_or_skip(test) {
        return;
    }
    let pid = std::process::id();
    let s = shape(mla);
    let decode: Vec<(Agent, Arc<HostBuffer>, KvLayout)> = (0..tp.1)
        .map(|r| {
            let a = agent(&format!("{test}-d{r}-{pid}"));
            let buf = Arc::new(HostBuffer::new(pool_len(s, tp.1, block.1, 0)).expect("alloc"));
            buf.fill(0xDD);
            let l = pool_layout(s, tp.1, r, block.1, order_of(order), 0, buf.addr());
            (a, buf, l)
        })
        .collect();
    let _regs: Vec<_> = decode
        .iter()
        .map(|(a, b, _)| a.register_mem(vec![b.clone()], &[]).expect("register"))
        .collect();
    let parent = &decode[0].0;
    let vars = |r: u32| {
        vec![
            ("tp", tp.0.to_string()),
            ("rank", r.to_string()),
            ("block", block.0.to_string()),
            ("tokens", tokens.to_string()),
            ("order", order.to_owned()),
            ("mla", if mla { "1" } else { "0" }.to_owned()),
        ]
    };
    let mut children = Vec::new();
    let mut prefill: Vec<(String, KvLayout)> = Vec::new();
    for r in 0..tp.0 {
        let v = vars(r);
        let v: Vec<(&str, &str)> = v.iter().map(|(k, x)| (*k, x.as_str())).collect();
        let mut c = Child::spawn(ENTRY, parent, &format!("{test}-p{r}-{pid}"), &v).expect("spawn");
        let (addr, layout) = parse_ready(&c.next(parent, DEADLINE).expect("ready"));
        for (a, _, _) in &decode[1..] {
            a.fetch_remote_metadata_blocking(c.name(), addr, DEADLINE)
                .expect("fetch the prefill rank's metadata");
        }
        prefill.push((c.name().to_owned(), layout));
        children.push(c);
    }
    let side: Vec<(&str, &KvLayout)> = prefill.iter().map(|(n, l)| (n.as_str(), l)).collect();
    let (sids, dids) = (
        ids_for(tokens, block.0, 3, POOL),
        ids_for(tokens, block.1, 7, POOL),
    );
    for (a, buf, l) in &decode {
        l.check_compatible(&prefill[0].1).expect("compatible");
        let plan = l.plan_read(&side, &sids, &dids, tokens).expect("plan");
        if mla {
            assert_eq!(
                plan.transfers.len(),
                1,
                "MLA reads its latent from one rank"
            );
        }
        for t in &plan.transfers {
            let req = a
                .create_xfer_req(
                    plan.op,
                    &t.local,
                    &t.remote,
                    &t.peer,
                    XferOptions::default(),
                )
                .expect("request");
            a.post_xfer_req(&req).expect("post");
            req.wait(DEADLINE).expect("transfer");
        }
        if let Err(e) = check_destination(l, &buf.to_vec(), &dids, tokens) {
            panic!("{}: {e}", a.name());
        }
    }
    drop(children);
}

#[test]
fn ucx_prefill_tp2_to_decode_tp4() {
    run("kvu24", (2, 4), (16, 16), "nhd", false, 45);
}

#[test]
fn ucx_prefill_tp4_to_decode_tp2_hnd_smaller_prefill_blocks() {
    run("kvu42", (4, 2), (16, 32), "hnd", false, 70);
}

#[test]
fn ucx_mla_tp2_to_tp4() {
    run("kvumla", (2, 4), (16, 16), "nhd", true, 40);
}

#[test]
fn ucx_decode_ranks_as_processes_tp2_to_tp4() {
    run_processes("kvup24", (2, 4), (16, 16), "nhd", 45);
}

#[test]
fn ucx_decode_ranks_as_processes_tp4_to_tp2_hnd_block_sizes_differ() {
    run_processes("kvup42", (4, 2), (32, 16), "hnd", 70);
}
