//! KV-cache layouts as data: a rank describes its paged KV cache once ([`KvLayout`]), peers
//! read the description ([`KvLayout::encode`] / [`KvLayout::decode`]), refuse a different model
//! ([`KvLayout::check_compatible`]), and the planner ([`KvLayout::plan`], one entry for both
//! directions; [`Agent::make_kv_xfers`](crate::Agent::make_kv_xfers) makes its requests) turns
//! two sides' descriptions and a request's block ids into what each rank posts: tensor-parallel sizes that differ (head slices, heads
//! gathered from several ranks, replicated heads), MLA's replicated latent (read once), and
//! block sizes that differ (a token lands in its own slot whatever the blocks are).
//!
//! A block of one tensor (one layer's K, V or MLA latent) holds `tokens_per_block` tokens of
//! `kv_heads` heads of `head_dim` elements of `elem_size` bytes, in [`KvOrder::Nhd`]
//! (`[token][head][dim]`) or [`KvOrder::Hnd`] (`[head][token][dim]`) order; a tensor is a pool
//! of `blocks` blocks `block_stride` bytes apart ([`KvTensor`]). Separate K and V tensors and
//! joint ones (`[2][blocks]...` or `[blocks][2]...`) are both a base and a stride per tensor.
//!
//! Plans are contiguous pieces, merged where both sides continue: whole blocks when the layouts
//! agree, a head slice per block (HND) or per token (NHD) when tensor-parallel sizes differ.
//! Two sides in different orders need a permute on the way, which a transport that only moves
//! bytes cannot do: the piece planner refuses that with a typed `NotSupported` naming the
//! permute, and the tile planner ([`KvLayout::plan_read_tiles`], [`KvLayout::plan_write_tiles`])
//! plans it as tiles whose rows the copy rearranges (`CUDA_IPC`'s copy kernel, `INPROC`), head
//! slices and gathers included, so the data lands in the destination's order in one pass.
//! Plans cost time linear in layers x blocks (x heads or tokens per block, never per element).

mod one;
mod plan;
mod tiles;

pub use one::{KvMoves, KvPeer, KvXfer, KvXferPlan};
pub use plan::{KvPeerXfer, KvPlan};
pub use tiles::{KvTilePlan, KvTileXfer};

use crate::bytes::{ByteReader, ByteWriter};
use crate::error::{DecodeError, Error, ErrorKind, Op, Result};
use crate::mem::MemKind;

/// The order of elements inside one block of one KV tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvOrder {
    /// `[token][head][dim]`: a token's heads are contiguous (vLLM's default).
    Nhd,
    /// `[head][token][dim]`: a head's tokens are contiguous.
    Hnd,
}

impl KvOrder {
    fn name(self) -> &'static str {
        match self {
            KvOrder::Nhd => "NHD",
            KvOrder::Hnd => "HND",
        }
    }
}

/// One tensor (one layer's K, V or MLA latent): a pool of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvTensor {
    /// Address of block 0.
    pub base: u64,
    /// Bytes from one block to the next (at least the block's size).
    pub block_stride: u64,
}

/// One rank's paged KV cache, filled once by the engine: [`KvLayout::new`], then the setters
/// ([`tp`](Self::tp) sets a rank's share of the heads).
///
/// ```
/// use nixl_core::kv::{KvLayout, KvOrder};
/// // Llama-3-8B's cache on rank 1 of TP 2: 32 layers, 16 tokens a block, 8 KV heads of 128 bf16.
/// let l = KvLayout::new("llama-3-8b", 32, 16, 8, 128, 2).order(KvOrder::Hnd).tp(1, 2).blocks(1024);
/// assert_eq!((l.kv_heads, l.head_range()), (4, (4, 4)));
/// assert_eq!(l.block_bytes(), 16 * 4 * 128 * 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvLayout {
    /// The model (a name or hash); peers with another model are refused.
    pub model: String,
    /// Layers.
    pub layers: u32,
    /// Tokens in one block.
    pub tokens_per_block: u32,
    /// KV heads this rank holds (1 for MLA).
    pub kv_heads: u32,
    /// KV heads of the model (1 for MLA).
    pub model_kv_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Bytes per element (2 for bf16/fp16, 1 for fp8).
    pub elem_size: u32,
    /// Element order inside a block.
    pub order: KvOrder,
    /// This rank's tensor-parallel rank.
    pub tp_rank: u32,
    /// The tensor-parallel size of this side.
    pub tp_size: u32,
    /// MLA: one latent tensor per layer, the same on every rank (read from one).
    pub mla: bool,
    /// Blocks in each tensor's pool.
    pub blocks: u64,
    /// Memory kind of the pools.
    pub kind: MemKind,
    /// Device of the pools (GPU ordinal; 0 for DRAM).
    pub dev_id: u64,
    /// The tensors, layer by layer: K then V (MLA: the latent only).
    pub tensors: Vec<KvTensor>,
}

crate::__setters!(KvLayout {
    model: String,
    layers: u32,
    tokens_per_block: u32,
    kv_heads: u32,
    head_dim: u32,
    elem_size: u32,
    order: KvOrder,
    blocks: u64,
    kind: MemKind,
    dev_id: u64,
    tensors: Vec<KvTensor>,
});

/// Limits of a decoded description (hostile bytes allocate nothing beyond them).
const MAX_LAYERS: u32 = 4096;
/// Tensor-parallel sizes and model heads accepted (a peer's description sizes the planner's
/// per-rank tables and loops: a lying one must not make them huge).
const MAX_TP: u32 = 1 << 16;
const MAX_HEADS: u32 = 1 << 16;
const MAX_MODEL: usize = 256;
const MAGIC: &[u8] = b"NXRSKV01";

pub(crate) fn kv_error(kind: ErrorKind, message: impl Into<String>) -> Error {
    Error::Local {
        op: Op::MakeXfer,
        kind,
        message: message.into(),
        source: None,
    }
}

/// The model's heads rank `rank` of a side of TP `tp` holds: `(first, count)`.
fn head_range_of(rank: u32, tp: u32, model_heads: u32, mla: bool) -> (u32, u32) {
    if mla {
        return (0, 1);
    }
    let tp = tp.max(1);
    if model_heads >= tp {
        let per = model_heads / tp;
        (rank.saturating_mul(per), per)
    } else {
        let first = u64::from(rank) * u64::from(model_heads) / u64::from(tp);
        (u32::try_from(first).unwrap_or(u32::MAX), 1)
    }
}

impl KvLayout {
    /// A one-rank layout (TP 1, all `model_kv_heads` heads, NHD, DRAM on device 0, no blocks
    /// or tensors yet): set the rest with the setters, [`tp`](Self::tp) and
    /// [`mla`](Self::mla) for a rank's share of the heads.
    pub fn new(
        model: impl Into<String>,
        layers: u32,
        tokens_per_block: u32,
        model_kv_heads: u32,
        head_dim: u32,
        elem_size: u32,
    ) -> Self {
        KvLayout {
            model: model.into(),
            layers,
            tokens_per_block,
            kv_heads: model_kv_heads,
            model_kv_heads,
            head_dim,
            elem_size,
            order: KvOrder::Nhd,
            tp_rank: 0,
            tp_size: 1,
            mla: false,
            blocks: 0,
            kind: MemKind::Dram,
            dev_id: 0,
            tensors: Vec::new(),
        }
    }

    /// This rank of a side of TP `size`: sets `tp_rank`, `tp_size` and the heads it holds
    /// (`kv_heads`, from `model_kv_heads`).
    #[must_use]
    pub fn tp(mut self, rank: u32, size: u32) -> Self {
        self.tp_rank = rank;
        self.tp_size = size;
        self.kv_heads = self.head_range().1;
        self
    }

    /// MLA (one latent tensor per layer, the same on every rank) or not; sets `kv_heads`
    /// (and `model_kv_heads`, 1 for MLA).
    #[must_use]
    pub fn mla(mut self, mla: bool) -> Self {
        self.mla = mla;
        if mla {
            self.model_kv_heads = 1;
        }
        self.kv_heads = self.head_range().1;
        self
    }

    /// Tensors per layer: 2 (K, V), or 1 for MLA.
    pub fn tensors_per_layer(&self) -> u32 {
        if self.mla {
            1
        } else {
            2
        }
    }

    /// Bytes of one block of one tensor.
    pub fn block_bytes(&self) -> u64 {
        u64::from(self.tokens_per_block)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.elem_size)
    }

    /// The model's heads this rank holds: `(first, count)`. With more ranks than heads (GQA at
    /// a large TP) a head is replicated on several ranks; MLA's latent is on every rank.
    pub fn head_range(&self) -> (u32, u32) {
        head_range_of(self.tp_rank, self.tp_size, self.model_kv_heads, self.mla)
    }

    /// Checks the description on its own: counts, heads against the tensor-parallel split,
    /// strides that hold a block, pools that do not wrap the address space.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(kv_error(ErrorKind::InvalidParam, m));
        if self.layers == 0 || self.layers > MAX_LAYERS {
            return bad(format!("layers {} (1..={MAX_LAYERS})", self.layers));
        }
        if self.tokens_per_block == 0 || self.head_dim == 0 || self.elem_size == 0 {
            return bad("tokens per block, head dim and element size must not be 0".into());
        }
        if self.tp_size == 0 || self.tp_size > MAX_TP || self.tp_rank >= self.tp_size {
            return bad(format!(
                "TP rank {} of size {} (sizes 1..={MAX_TP})",
                self.tp_rank, self.tp_size
            ));
        }
        if self.model_kv_heads > MAX_HEADS {
            return bad(format!(
                "{} KV heads (at most {MAX_HEADS})",
                self.model_kv_heads
            ));
        }
        if self.mla {
            if self.kv_heads != 1 || self.model_kv_heads != 1 {
                return bad("an MLA cache has one latent head per rank and model".into());
            }
        } else {
            if self.model_kv_heads == 0 {
                return bad("model KV heads must not be 0".into());
            }
            if self.model_kv_heads >= self.tp_size
                && !self.model_kv_heads.is_multiple_of(self.tp_size)
            {
                return bad(format!(
                    "{} KV heads do not split over TP {}",
                    self.model_kv_heads, self.tp_size
                ));
            }
            if self.kv_heads != self.head_range().1 {
                return bad(format!(
                    "rank holds {} KV heads; {} over TP {} gives {}",
                    self.kv_heads,
                    self.model_kv_heads,
                    self.tp_size,
                    self.head_range().1
                ));
            }
        }
        let want = self.layers as usize * self.tensors_per_layer() as usize;
        if self.tensors.len() != want {
            return bad(format!(
                "{} tensors for {} layers ({} each)",
                self.tensors.len(),
                self.layers,
                self.tensors_per_layer()
            ));
        }
        let bytes = u64::from(self.tokens_per_block)
            .checked_mul(u64::from(self.kv_heads))
            .and_then(|v| v.checked_mul(u64::from(self.head_dim)))
            .and_then(|v| v.checked_mul(u64::from(self.elem_size)));
        let Some(bytes) = bytes else {
            return bad("block size overflows".into());
        };
        for (i, t) in self.tensors.iter().enumerate() {
            if t.block_stride < bytes {
                return bad(format!(
                    "tensor {i}: block stride {} is smaller than a block ({bytes})",
                    t.block_stride
                ));
            }
            let end = self
                .blocks
                .checked_sub(1)
                .and_then(|last| last.checked_mul(t.block_stride))
                .and_then(|off| off.checked_add(bytes))
                .and_then(|len| t.base.checked_add(len));
            if self.blocks > 0 && end.is_none() {
                return bad(format!("tensor {i}: the pool wraps the address space"));
            }
        }
        Ok(())
    }

    /// Refuses a peer whose cache cannot hold the same tokens: another model, layer count,
    /// head dim, element size, model head count, or MLA on one side only (`Mismatch`).
    pub fn check_compatible(&self, peer: &KvLayout) -> Result<()> {
        let diff = |what: &str, a: String, b: String| {
            Err(kv_error(
                ErrorKind::Mismatch,
                format!("KV layouts differ in {what}: {a} here, {b} at the peer"),
            ))
        };
        if self.model != peer.model {
            return diff("model", self.model.clone(), peer.model.clone());
        }
        if self.layers != peer.layers {
            return diff("layers", self.layers.to_string(), peer.layers.to_string());
        }
        if self.head_dim != peer.head_dim {
            return diff(
                "head dim",
                self.head_dim.to_string(),
                peer.head_dim.to_string(),
            );
        }
        if self.elem_size != peer.elem_size {
            return diff(
                "element size (dtype)",
                self.elem_size.to_string(),
                peer.elem_size.to_string(),
            );
        }
        if self.mla != peer.mla {
            return diff("MLA", self.mla.to_string(), peer.mla.to_string());
        }
        if self.model_kv_heads != peer.model_kv_heads {
            return diff(
                "model KV heads",
                self.model_kv_heads.to_string(),
                peer.model_kv_heads.to_string(),
            );
        }
        Ok(())
    }

    /// The description's bytes, for a peer (beside the agent's metadata, e.g. in a
    /// notification or the application's own handshake).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = ByteWriter::new();
        w.put(MAGIC)
            .put_str(&self.model)
            .put_u32(self.layers)
            .put_u32(self.tokens_per_block)
            .put_u32(self.kv_heads)
            .put_u32(self.model_kv_heads)
            .put_u32(self.head_dim)
            .put_u32(self.elem_size)
            .put_u8(match self.order {
                KvOrder::Nhd => 0,
                KvOrder::Hnd => 1,
            })
            .put_u32(self.tp_rank)
            .put_u32(self.tp_size)
            .put_bool(self.mla)
            .put_u64(self.blocks)
            .put_u8(self.kind.tag())
            .put_u64(self.dev_id)
            .put_len(self.tensors.len());
        for t in &self.tensors {
            w.put_u64(t.base).put_u64(t.block_stride);
        }
        w.into_vec()
    }

    /// Decodes [`KvLayout::encode`]'s bytes and validates the result: bounded, typed
    /// (`Decode` for malformed bytes, `InvalidParam` for a description that does not hold
    /// together), nothing allocated beyond the input's size.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let l = Self::decode_bytes(bytes).map_err(|e| e.outside_agent(Op::LoadMetadata))?;
        l.validate()?;
        Ok(l)
    }

    fn decode_bytes(bytes: &[u8]) -> std::result::Result<Self, DecodeError> {
        let mut r = ByteReader::new(bytes);
        r.magic(MAGIC)?;
        let model = r.str("model", MAX_MODEL)?.to_owned();
        let (layers, tokens_per_block, kv_heads, model_kv_heads, head_dim, elem_size) =
            (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let order = match r.u8()? {
            0 => KvOrder::Nhd,
            1 => KvOrder::Hnd,
            _ => return Err(DecodeError::Invalid { what: "KV order" }),
        };
        let (tp_rank, tp_size) = (r.u32()?, r.u32()?);
        let mla = r.bool("MLA flag")?;
        let blocks = r.u64()?;
        let kind = MemKind::from_tag(r.u8()?).ok_or(DecodeError::Invalid {
            what: "memory kind",
        })?;
        let dev_id = r.u64()?;
        let n = r.count("KV tensors", 2 * MAX_LAYERS as usize, 16)?;
        let mut tensors = Vec::with_capacity(n);
        for _ in 0..n {
            tensors.push(KvTensor {
                base: r.u64()?,
                block_stride: r.u64()?,
            });
        }
        r.finish()?;
        Ok(KvLayout {
            model,
            layers,
            tokens_per_block,
            kv_heads,
            model_kv_heads,
            head_dim,
            elem_size,
            order,
            tp_rank,
            tp_size,
            mla,
            blocks,
            kind,
            dev_id,
            tensors,
        })
    }
}
