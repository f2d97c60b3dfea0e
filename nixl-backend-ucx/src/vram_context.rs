//! The CUDA context of UCX's CUDA transports: recorded by the first VRAM registration, made
//! current by every thread that takes a worker lock.

use std::cell::Cell;
use std::sync::OnceLock;

/// The CUDA context UCX's CUDA transports use: the primary context of the first GPU whose
/// memory was registered (nixl-mem's one context policy).
///
/// UCX's `cuda_copy`/`cuda_ipc` memory domains query pointer attributes and issue copies in the
/// calling thread's current CUDA context; with none current, registering VRAM fails ("failed
/// to insert region [0x0..0x0]"). So the first VRAM registration makes the region's GPU's
/// primary context current and records it, and every thread that later takes a worker lock
/// (posting, polling, the progress threads) makes it current once ([`apply_vram_context`]).
/// Nothing of CUDA is loaded unless VRAM is registered.
static VRAM_CONTEXT: OnceLock<nixl_mem::Context> = OnceLock::new();

thread_local! {
    /// The GPU ordinal + 1 whose context this thread made current (0: none).
    static APPLIED: Cell<usize> = const { Cell::new(0) };
}

/// Why VRAM cannot be registered with UCX here.
pub(crate) enum NoContext {
    /// The GPU's context is not available.
    Unavailable(String),
    /// Another GPU's VRAM was registered first: UCX's threads run in that GPU's context.
    SecondGpu { first: usize, this: usize },
}

/// Makes the primary context of GPU `device` current on this thread and records it for the
/// worker threads. Called before registering VRAM. UCX's CUDA transports use the calling
/// thread's context, and every thread of the backend gets one: VRAM of a second GPU is refused
/// (its copies would run in the first GPU's context, on a slower path than the hardware
/// allows, or fail) rather than registered with a warning.
pub(crate) fn ensure_vram_context(device: u64) -> std::result::Result<(), NoContext> {
    let ordinal = usize::try_from(device)
        .map_err(|_| NoContext::Unavailable(format!("device id {device} is not a CUDA ordinal")))?;
    if let Some(first) = VRAM_CONTEXT.get() {
        if first.ordinal() != ordinal {
            return Err(NoContext::SecondGpu {
                first: first.ordinal(),
                this: ordinal,
            });
        }
    }
    let ctx =
        nixl_mem::Context::primary(ordinal).map_err(|e| NoContext::Unavailable(e.to_string()))?;
    ctx.bind()
        .map_err(|e| NoContext::Unavailable(e.to_string()))?;
    let recorded = VRAM_CONTEXT.get_or_init(|| ctx.clone());
    if recorded.ordinal() != ordinal {
        return Err(NoContext::SecondGpu {
            first: recorded.ordinal(),
            this: ordinal,
        });
    }
    APPLIED.with(|a| a.set(ordinal + 1));
    Ok(())
}

/// Makes the recorded context current on this thread, once (a no-op until VRAM is registered).
pub(crate) fn apply_vram_context() {
    let Some(ctx) = VRAM_CONTEXT.get() else {
        return;
    };
    if APPLIED.with(Cell::get) == ctx.ordinal() + 1 {
        return;
    }
    if ctx.bind().is_ok() {
        APPLIED.with(|a| a.set(ctx.ordinal() + 1));
    }
}
