//! KV-cache pools for the layout planner's tests: a pool laid out by a [`KvLayout`], filled
//! with a value per (layer, tensor, token, head, dim) computed here, independently of the
//! planner, and checked element by element.

use std::net::SocketAddr;

use nixl_core::kv::{KvLayout, KvOrder, KvTensor};

/// Bytes per element of the test pools (u32 values: distinct per element).
pub const ELEM: u32 = 4;

/// The value of one element: distinct for every (layer, tensor, token, head, dim) in range.
pub fn value(layer: u32, tensor: u32, token: u64, head: u32, d: u32) -> u32 {
    let x = (u64::from(layer) << 48)
        ^ (u64::from(tensor) << 44)
        ^ (token << 20)
        ^ (u64::from(head) << 12)
        ^ u64::from(d);
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
}

/// The model shape shared by every rank of a test.
#[derive(Debug, Clone, Copy)]
pub struct KvShape {
    /// Layers.
    pub layers: u32,
    /// KV heads of the model (1 for MLA).
    pub heads: u32,
    /// Elements per head.
    pub dim: u32,
    /// MLA (one latent tensor per layer).
    pub mla: bool,
    /// Blocks in each pool.
    pub blocks: u64,
}

/// The layout of rank `r` of a side of TP `tp`, its tensors one after another from `base`,
/// blocks `pad` bytes apart beyond their size.
pub fn pool_layout(
    s: KvShape,
    tp: u32,
    r: u32,
    tokens_per_block: u32,
    order: KvOrder,
    pad: u64,
    base: u64,
) -> KvLayout {
    let mut l = KvLayout::new("kv-test", s.layers, tokens_per_block, s.heads, s.dim, ELEM)
        .order(order)
        .tp(r, tp)
        .mla(s.mla)
        .blocks(s.blocks);
    let stride = l.block_bytes() + pad;
    let n = u64::from(s.layers) * u64::from(l.tensors_per_layer());
    l.tensors = (0..n)
        .map(|i| KvTensor {
            base: base + i * s.blocks * stride,
            block_stride: stride,
        })
        .collect();
    l
}

/// Bytes of the pool [`pool_layout`] lays out for these parameters.
pub fn pool_len(s: KvShape, tp: u32, tokens_per_block: u32, pad: u64) -> usize {
    let l = pool_layout(s, tp, 0, tokens_per_block, KvOrder::Nhd, pad, 0);
    (l.tensors.len() as u64 * s.blocks * (l.block_bytes() + pad)) as usize
}

/// Byte offset (from the pool's base, `l.tensors[0].base`) of element (block, slot, local
/// head, dim) of tensor `ti`, by the layout's order.
pub fn offset(l: &KvLayout, ti: usize, block: u64, slot: u64, hl: u64, d: u64) -> usize {
    let t = l.tensors[ti];
    let (b, h, dim) = (
        u64::from(l.tokens_per_block),
        u64::from(l.kv_heads),
        u64::from(l.head_dim),
    );
    let inner = match l.order {
        KvOrder::Nhd => (slot * h + hl) * dim + d,
        KvOrder::Hnd => (hl * b + slot) * dim + d,
    };
    (t.base - l.tensors[0].base + block * t.block_stride + inner * u64::from(ELEM)) as usize
}

/// Calls `f(offset, value)` for every element of the request's first `tokens` tokens this
/// rank holds (its heads), blocks `ids`.
fn each(l: &KvLayout, ids: &[u64], tokens: u64, mut f: impl FnMut(usize, u32, String)) {
    let (first, _) = l.head_range();
    let tpl = l.tensors_per_layer();
    let b = u64::from(l.tokens_per_block);
    for ti in 0..l.tensors.len() {
        let (layer, tensor) = (ti as u32 / tpl, ti as u32 % tpl);
        for t in 0..tokens {
            for hl in 0..u64::from(l.kv_heads) {
                for d in 0..u64::from(l.head_dim) {
                    let h = first + hl as u32;
                    let at = offset(l, ti, ids[(t / b) as usize], t % b, hl, d);
                    f(
                        at,
                        value(layer, tensor, t, h, d as u32),
                        format!("layer {layer} tensor {tensor} token {t} head {h} dim {d}"),
                    );
                }
            }
        }
    }
}

/// The source pool's bytes: the request's tokens with their values, everything else 0xEE.
pub fn source_bytes(l: &KvLayout, len: usize, ids: &[u64], tokens: u64) -> Vec<u8> {
    let mut bytes = vec![0xEEu8; len];
    each(l, ids, tokens, |at, v, _| {
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes())
    });
    bytes
}

/// Checks a destination pool (filled with 0xDD before): each element of the request holds
/// its value, every other byte is still 0xDD. The first difference, described.
pub fn check_destination(l: &KvLayout, got: &[u8], ids: &[u64], tokens: u64) -> Result<(), String> {
    let mut touched = vec![false; got.len()];
    let mut bad = None;
    each(l, ids, tokens, |at, want, what| {
        let have = u32::from_le_bytes([got[at], got[at + 1], got[at + 2], got[at + 3]]);
        if have != want && bad.is_none() {
            bad = Some(format!("{what}: {have:#x}, expected {want:#x}"));
        }
        touched[at..at + 4].iter_mut().for_each(|x| *x = true);
    });
    if let Some(b) = bad {
        return Err(b);
    }
    match got
        .iter()
        .zip(&touched)
        .position(|(&byte, &t)| !t && byte != 0xDD)
    {
        Some(i) => Err(format!("byte {i} outside the request changed")),
        None => Ok(()),
    }
}

/// A request's block ids on one side: scattered over the pool, not in order.
pub fn ids_for(tokens: u64, tokens_per_block: u32, salt: u64, pool_blocks: u64) -> Vec<u64> {
    let n = tokens.div_ceil(u64::from(tokens_per_block));
    (0..n).map(|i| (i * 5 + salt) % pool_blocks).collect()
}

/// The message a source rank in a child process announces itself with: its side channel and
/// its layout's bytes.
pub fn ready_message(addr: SocketAddr, layout: &KvLayout) -> Vec<u8> {
    format!("ready {addr} {}", crate::hex(&layout.encode())).into_bytes()
}

/// Reads [`ready_message`]'s side channel and layout (the layout through `KvLayout::decode`,
/// as a peer's bytes). Panics on a malformed message: test helper.
pub fn parse_ready(msg: &[u8]) -> (SocketAddr, KvLayout) {
    let msg = std::str::from_utf8(msg).expect("a text message");
    let mut it = msg.split(' ').skip(1);
    let addr = it.next().and_then(|a| a.parse().ok()).expect("an address");
    let layout =
        KvLayout::decode(&crate::unhex(it.next().expect("layout bytes"))).expect("a layout");
    (addr, layout)
}
