//! The copy kernel's shape: chunk size, CTAs, threads, loads in flight, load and store hints,
//! schedule; its text form and the sweep.

#[allow(unused_imports)]
use super::*;

/// How the copy kernel's descriptors are assigned to CTAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelSchedule {
    /// As many CTAs as fit on the GPU at once; CTA `i` copies descriptors `i`, `i + grid`, ...
    /// (the last round of descriptors may leave some CTAs idle).
    Persistent,
    /// As `Persistent`, but the request's bytes are first split into one equal share per CTA
    /// (each share cut into descriptors of at most `chunk` bytes, padded with empty ones), so
    /// every CTA copies the same number of bytes.
    Balanced,
    /// One CTA per descriptor; the hardware starts CTAs as others finish.
    PerChunk,
}

impl KernelSchedule {
    fn name(self) -> &'static str {
        match self {
            KernelSchedule::Persistent => "persistent",
            KernelSchedule::Balanced => "balanced",
            KernelSchedule::PerChunk => "per-chunk",
        }
    }
}

/// The copy kernel's shape: how requests are cut, how many CTAs of how many threads copy them,
/// and how each thread issues its loads and stores. The default is the shape measured first
/// (docs/perf/gpu.md, run 2). Written and parsed as
/// `chunk=128k,ctas=8,threads=256,unroll=4,load=nc,store=cs,schedule=persistent` (any subset
/// of the keys, the rest default; sizes in bytes or with `k`/`m`; `load` is `nc` or `plain`;
/// `store` is `cs` or `wb`; `schedule` is `persistent`, `balanced` or `per-chunk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct KernelShape {
    /// The largest descriptor in bytes: a multiple of 16, from 4 KiB to 1 GiB.
    pub chunk: u64,
    /// At most this many CTAs per SM (1 to 32); fewer where the GPU's occupancy calculator
    /// allows fewer (registers, threads).
    pub ctas_per_sm: u32,
    /// Threads per CTA: a multiple of 32, from 32 to 1024.
    pub threads: u32,
    /// 16-byte loads each thread issues before it stores them: 1 to 8.
    pub unroll: u32,
    /// Load the body through the read-only path (`ld.global.nc`) rather than with a plain
    /// `ld.global`. `ptxas` may sink read-only loads below the stores that follow them (it
    /// does, to stay at 32 registers), so with `.nc` at most about four loads are in flight
    /// whatever `unroll` says; plain loads keep all `unroll` ahead of the round's stores (more
    /// registers: 48-54 for 8).
    pub nc_loads: bool,
    /// Store with the streaming hint (`st.global.cs`, evict first) rather than the default
    /// write-back (`st.global`, i.e. `.wb`).
    pub streaming_stores: bool,
    /// How descriptors are assigned to CTAs.
    pub schedule: KernelSchedule,
}

nixl_core::__setters!(KernelShape {
    chunk: u64,
    ctas_per_sm: u32,
    threads: u32,
    unroll: u32,
    nc_loads: bool,
    streaming_stores: bool,
    schedule: KernelSchedule,
});

/// The shape of docs/perf/gpu.md's run 2 on an H200, the sweep's baseline.
pub(super) const BASE: KernelShape = KernelShape {
    chunk: 128 << 10,
    ctas_per_sm: 8,
    threads: 256,
    unroll: 4,
    nc_loads: true,
    streaming_stores: true,
    schedule: KernelSchedule::Persistent,
};

/// The default: the winner of `gpu_bench --sweep` on an NVIDIA H200 (2026-11-22, docs/perf/gpu.md):
/// per-block VRAM<->VRAM at 1 and 4 MiB x 1024, slowest cell 1925.9 GB/s (the first shape,
/// `BASE`, reached 1815.0).
pub(super) const TUNED: KernelShape = KernelShape {
    chunk: 64 << 10,
    ctas_per_sm: 8,
    threads: 256,
    unroll: 8,
    nc_loads: false,
    streaming_stores: true,
    schedule: KernelSchedule::PerChunk,
};

impl Default for KernelShape {
    fn default() -> Self {
        TUNED
    }
}

pub(super) fn size_text(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}m", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}k", n >> 10)
    } else {
        n.to_string()
    }
}

pub(super) fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim().to_ascii_lowercase();
    let (num, shift) = match v.as_bytes().last() {
        Some(b'k') => (&v[..v.len() - 1], 10),
        Some(b'm') => (&v[..v.len() - 1], 20),
        _ => (&v[..], 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

impl fmt::Display for KernelShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "chunk={},ctas={},threads={},unroll={},load={},store={},schedule={}",
            size_text(self.chunk),
            self.ctas_per_sm,
            self.threads,
            self.unroll,
            if self.nc_loads { "nc" } else { "plain" },
            if self.streaming_stores { "cs" } else { "wb" },
            self.schedule.name()
        )
    }
}

impl FromStr for KernelShape {
    type Err = String;

    /// Parses the [`Display`](fmt::Display) form (any subset of its keys) and validates it.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut k = KernelShape::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, v) = item
                .split_once('=')
                .ok_or_else(|| format!("copy kernel shape item {item:?} is not key=value"))?;
            let bad = || format!("copy kernel shape: {key}={v:?} is not valid");
            let num = |v: &str| v.trim().parse::<u32>().map_err(|_| bad());
            match key.trim() {
                "chunk" => k.chunk = parse_size(v).ok_or_else(bad)?,
                "ctas" => k.ctas_per_sm = num(v)?,
                "threads" => k.threads = num(v)?,
                "unroll" => k.unroll = num(v)?,
                "load" => {
                    k.nc_loads = match v.trim() {
                        "nc" => true,
                        "plain" => false,
                        _ => return Err(bad()),
                    }
                }
                "store" => {
                    k.streaming_stores = match v.trim() {
                        "cs" => true,
                        "wb" => false,
                        _ => return Err(bad()),
                    }
                }
                "schedule" => {
                    k.schedule = match v.trim() {
                        "persistent" => KernelSchedule::Persistent,
                        "balanced" => KernelSchedule::Balanced,
                        "per-chunk" => KernelSchedule::PerChunk,
                        _ => return Err(bad()),
                    }
                }
                other => return Err(format!("copy kernel shape has no key {other:?}")),
            }
        }
        k.validate()?;
        Ok(k)
    }
}

impl KernelShape {
    /// Whether every field is in range; the error names the first that is not.
    pub fn validate(&self) -> Result<(), String> {
        if !self.chunk.is_multiple_of(16) || !(4 << 10..=1 << 30).contains(&self.chunk) {
            return Err(format!(
                "copy kernel chunk {} is not a multiple of 16 from 4 KiB to 1 GiB",
                self.chunk
            ));
        }
        if !(1..=32).contains(&self.ctas_per_sm) {
            return Err(format!(
                "copy kernel CTAs per SM {} is not 1 to 32",
                self.ctas_per_sm
            ));
        }
        if !self.threads.is_multiple_of(32) || !(32..=1024).contains(&self.threads) {
            return Err(format!(
                "copy kernel threads {} is not a multiple of 32 from 32 to 1024",
                self.threads
            ));
        }
        if !(1..=8).contains(&self.unroll) {
            return Err(format!("copy kernel unroll {} is not 1 to 8", self.unroll));
        }
        Ok(())
    }

    /// The shapes `gpu_bench --sweep` measures, with a short name each: the measured
    /// baseline first (run 2's shape, whatever the default is now), then mostly one change at
    /// a time (docs/perf/gpu.md says why each). Every `u8` shape uses plain loads, so its eight
    /// loads really are in flight.
    pub fn sweep() -> Vec<(&'static str, KernelShape)> {
        let d = BASE;
        let b = KernelShape {
            schedule: KernelSchedule::Balanced,
            ..d
        };
        let u8 = |s: KernelShape| KernelShape {
            unroll: 8,
            nc_loads: false,
            ..s
        };
        let big = |chunk_kib: u64, ctas_per_sm: u32, threads: u32| KernelShape {
            chunk: chunk_kib << 10,
            ctas_per_sm,
            threads,
            ..b
        };
        let per_chunk = KernelShape {
            schedule: KernelSchedule::PerChunk,
            ..d
        };
        vec![
            ("base", d),
            ("balanced", b),
            (
                "balanced-wb",
                KernelShape {
                    streaming_stores: false,
                    ..b
                },
            ),
            (
                "balanced-plain",
                KernelShape {
                    nc_loads: false,
                    ..b
                },
            ),
            ("balanced-u8", u8(b)),
            ("per-chunk", per_chunk),
            (
                "per-chunk-64k-u8",
                u8(KernelShape {
                    chunk: 64 << 10,
                    ..per_chunk
                }),
            ),
            ("bal-256k-4x512", big(256, 4, 512)),
            ("bal-256k-4x512-u8", u8(big(256, 4, 512))),
            ("bal-512k-2x1024", big(512, 2, 1024)),
            ("bal-512k-2x1024-u8", u8(big(512, 2, 1024))),
            ("bal-1m-2x512-u8", u8(big(1024, 2, 512))),
        ]
    }
}
