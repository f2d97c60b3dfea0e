//! GPU helpers (feature `gpu`).

pub use crate::{first_diff, hex, pattern, run_child, unhex};

/// The environment variable that tells a child GPU test process its role.
pub const ROLE: &str = "NIXL_MEM_TEST_ROLE";

/// Whether a CUDA GPU is usable here; reports the skip (see [`crate::skip`]) when not, and the
/// caller returns.
pub fn gpu(test: &str) -> bool {
    match nixl_mem::cuda::driver() {
        Ok(()) => true,
        Err(e) => {
            crate::skip(
                test,
                crate::Dep::Gpu,
                format!("no usable CUDA GPU here ({e})"),
            );
            false
        }
    }
}

/// Whether two CUDA GPUs are usable here; reports the skip (`gpu`, or `multi-gpu` with fewer
/// than two) when not, and the caller returns.
pub fn two_gpus(test: &str) -> bool {
    if !gpu(test) {
        return false;
    }
    match nixl_mem::cuda::device_count() {
        Ok(n) if n >= 2 => true,
        n => {
            crate::skip(
                test,
                crate::Dep::MultiGpu,
                format!("two GPUs needed, {n:?} visible"),
            );
            false
        }
    }
}

/// The layer waiter's PTX: one CTA per layer. Thread 0 records the time it starts, spins
/// until the layer's arrival counter reaches `target` (an acquire load), records the time it
/// is released; then the CTA sums the layer's destination bytes (u32 words of
/// `[bases[l], + bytes)`, loads that skip L1) into `sums[l]`. What a decode kernel for layer
/// `l` does before it reads layer `l`, with a checksum standing in for the attention.
const WAITER_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry nixl_layer_waiter(
	.param .u64 counters,
	.param .u64 target,
	.param .u64 bases,
	.param .u64 bytes,
	.param .u64 sums,
	.param .u64 times,
	.param .u64 starts
)
{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<5>;
	.reg .b64 	%rd<30>;

	ld.param.u64 	%rd1, [counters];
	cvta.to.global.u64 	%rd1, %rd1;
	ld.param.u64 	%rd2, [target];
	ld.param.u64 	%rd3, [bases];
	cvta.to.global.u64 	%rd3, %rd3;
	ld.param.u64 	%rd4, [bytes];
	ld.param.u64 	%rd5, [sums];
	cvta.to.global.u64 	%rd5, %rd5;
	ld.param.u64 	%rd6, [times];
	cvta.to.global.u64 	%rd6, %rd6;
	ld.param.u64 	%rd7, [starts];
	cvta.to.global.u64 	%rd7, %rd7;
	mov.u32 	%r1, %ctaid.x;
	cvt.u64.u32 	%rd8, %r1;
	mov.u32 	%r2, %tid.x;
	cvt.u64.u32 	%rd9, %r2;
	mov.u32 	%r3, %ntid.x;
	cvt.u64.u32 	%rd10, %r3;
	shl.b64 	%rd11, %rd8, 3;
	setp.ne.u64 	%p1, %rd9, 0;
	@%p1 bra 	$L_released;
	mov.u64 	%rd12, %globaltimer;
	add.u64 	%rd13, %rd7, %rd11;
	st.global.u64 	[%rd13], %rd12;
	add.u64 	%rd14, %rd1, %rd11;
$L_spin:
	ld.acquire.gpu.global.u64 	%rd15, [%rd14];
	setp.lt.u64 	%p2, %rd15, %rd2;
	@%p2 bra 	$L_spin;
	mov.u64 	%rd12, %globaltimer;
	add.u64 	%rd13, %rd6, %rd11;
	st.global.u64 	[%rd13], %rd12;
$L_released:
	bar.sync 	0;
	add.u64 	%rd16, %rd3, %rd11;
	ld.global.u64 	%rd17, [%rd16];
	mov.u64 	%rd18, 0;
	shl.b64 	%rd19, %rd9, 2;
	shl.b64 	%rd20, %rd10, 2;
$L_sum:
	setp.ge.u64 	%p3, %rd19, %rd4;
	@%p3 bra 	$L_summed;
	add.u64 	%rd21, %rd17, %rd19;
	ld.global.cg.u32 	%r4, [%rd21];
	cvt.u64.u32 	%rd22, %r4;
	add.u64 	%rd18, %rd18, %rd22;
	add.u64 	%rd19, %rd19, %rd20;
	bra 	$L_sum;
$L_summed:
	add.u64 	%rd23, %rd5, %rd11;
	atom.global.add.u64 	%rd24, [%rd23], %rd18;
	ret;
}
"#;

/// A decode GPU's stand-in for layer-wise attention: one CTA per layer waits on the GPU for
/// the layer's arrival counter, then reads (sums) the layer's bytes. Launched before the
/// transfer is posted, on its own stream.
#[derive(Debug)]
pub struct LayerWaiter {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    f: cudarc::driver::CudaFunction,
}

/// A launched [`LayerWaiter`]: per layer, the checksum of its bytes, the time its CTA
/// started and the time it was released (GPU global timer, ns).
#[derive(Debug)]
pub struct LayerWait {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    sums: cudarc::driver::CudaSlice<u64>,
    times: cudarc::driver::CudaSlice<u64>,
    starts: cudarc::driver::CudaSlice<u64>,
    _bases: cudarc::driver::CudaSlice<u64>,
}

/// What each layer saw: `(checksum, started ns, released ns)`.
pub type LayerSeen = Vec<(u64, u64, u64)>;

impl LayerWaiter {
    /// Loads the waiter on GPU `ordinal` (the primary context, which the CUDA_IPC backend
    /// shares).
    pub fn new(ordinal: usize) -> Result<Self, String> {
        let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| e.to_string())?;
        let m = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(WAITER_PTX))
            .map_err(|e| format!("loading the waiter: {e}"))?;
        let f = m
            .load_function("nixl_layer_waiter")
            .map_err(|e| e.to_string())?;
        let stream = ctx.new_stream().map_err(|e| e.to_string())?;
        Ok(LayerWaiter { stream, f })
    }

    /// Launches one waiting CTA per layer: layer `l` waits for `counters[l] >= target`, then
    /// sums `bytes` bytes at `bases[l]` (device addresses of this GPU).
    pub fn launch(
        &self,
        counters: u64,
        target: u64,
        bases: &[u64],
        bytes: u64,
    ) -> Result<LayerWait, String> {
        let s = &self.stream;
        let n = bases.len();
        let e = |e: cudarc::driver::DriverError| e.to_string();
        let bases_d = s.clone_htod(bases).map_err(e)?;
        let sums = s.alloc_zeros::<u64>(n).map_err(e)?;
        let times = s.alloc_zeros::<u64>(n).map_err(e)?;
        let starts = s.alloc_zeros::<u64>(n).map_err(e)?;
        use cudarc::driver::PushKernelArg;
        let mut b = s.launch_builder(&self.f);
        b.arg(&counters);
        b.arg(&target);
        b.arg(&bases_d);
        b.arg(&bytes);
        b.arg(&sums);
        b.arg(&times);
        b.arg(&starts);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (u32::try_from(n).map_err(|_| "too many layers")?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's seven u64 parameters; `bases`, `sums`,
        // `times`, `starts` are this launch's allocations (kept in the returned value), and
        // the caller names counters and `bytes` bytes at each base in memory of this GPU
        // that outlives the launch.
        unsafe { b.launch(cfg) }.map_err(e)?;
        Ok(LayerWait {
            stream: s.clone(),
            sums,
            times,
            starts,
            _bases: bases_d,
        })
    }
}

impl LayerWait {
    /// Waits for every layer's CTA and returns what each saw.
    pub fn finish(self) -> Result<LayerSeen, String> {
        let e = |e: cudarc::driver::DriverError| e.to_string();
        self.stream.synchronize().map_err(e)?;
        let sums = self.stream.clone_dtoh(&self.sums).map_err(e)?;
        let times = self.stream.clone_dtoh(&self.times).map_err(e)?;
        let starts = self.stream.clone_dtoh(&self.starts).map_err(e)?;
        Ok(sums
            .into_iter()
            .zip(starts)
            .zip(times)
            .map(|((s, a), t)| (s, a, t))
            .collect())
    }
}
