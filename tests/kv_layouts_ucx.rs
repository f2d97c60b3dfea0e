//! KV layouts over UCX between processes (issue 26): each prefill rank is its own process
//! (this test binary spawned again), with its pool filled and its layout sent to the decode
//! side as bytes (`KvLayout::encode` in a notification); the decode ranks, agents of this
//! process, check the description, plan their reads and pull over UCX tcp. Every element of the
//! request is compared with its value computed from (layer, tensor, token, head, dim), and
//! every byte outside the request must be unchanged.

use std::sync::Arc;
use std::time::Duration;

use nixl::{Agent, AgentConfig, HostBuffer, KvLayout, KvOrder, XferOptions};
use nixl_testkit::kv::{
    check_destination, ids_for, parse_ready, pool_layout, pool_len, ready_message, source_bytes,
    KvShape,
};
use nixl_testkit::two_process::{child_main, Child};
use nixl_testkit::ucx::{params, ucx_or_skip, TCP};

const ENTRY: &str = "kv_prefill_rank";
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
        AgentConfig {
            listen: true,
            default_timeout: Duration::from_secs(20),
            ..AgentConfig::default()
        },
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
