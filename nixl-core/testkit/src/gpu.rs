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

/// The role of the target process of [`killed_target_case`].
pub const LANDED_TARGET: &str = "landed-target";

/// Sizes the kill conformance case cycles through (1-256 MiB).
const KILL_SIZES: [usize; 4] = [1 << 20, 16 << 20, 64 << 20, 256 << 20];
/// The block each descriptor moves in the kill conformance case.
const KILL_BLOCK: u64 = 64 << 10;

/// Issue 33's conformance case on a GPU transport (two processes, one GPU): a target process
/// (the test binary's `entry`, which calls [`landed_target`]) is SIGKILLed at a random point
/// of a 1-256 MiB READ or WRITE of VRAM by `a`. A request never ends `Done` unless (READ) every
/// byte of `a`'s VRAM is the target's pattern; every other end is a typed error; once terminal
/// the request is quiescent within 10 s, and a fresh sentinel in `a`'s VRAM then stays
/// untouched for 200 ms. (A WRITE's destination dies with the target: its bytes cannot be read
/// back; its end and quiescence are checked.) `NIXL_KILLS` kills per operation (default 6);
/// the tally by end state is printed.
pub fn killed_target_case(test: &str, transport: &str, a: &nixl_core::Agent, entry: &str) {
    use nixl_core::{Desc, MemKind, XferDescList, XferOp, XferOptions};
    use std::time::{Duration, Instant};
    const WAIT: Duration = Duration::from_secs(30);
    let kills: usize = std::env::var("NIXL_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let blocks = |base: u64, n: usize| {
        XferDescList::from_descs(
            MemKind::Vram,
            (0..n as u64).map(|i| Desc::on_device(base + i * KILL_BLOCK, KILL_BLOCK, 0)),
        )
    };
    let top = KILL_SIZES[KILL_SIZES.len() - 1];
    let local = std::sync::Arc::new(nixl_mem::DeviceBuffer::new(0, top).expect("VRAM"));
    let _rl = a.register_mem(vec![local.clone()], &[]).expect("register");
    let dir = std::env::temp_dir().join(format!("nixl-landed-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ u64::from(std::process::id());
    let mut tally: std::collections::BTreeMap<String, usize> = Default::default();
    for k in 0..2 * kills {
        let op = if k % 2 == 0 {
            XferOp::Read
        } else {
            XferOp::Write
        };
        let len = KILL_SIZES[(k / 2) % KILL_SIZES.len()];
        let seed = 100 + k as u64;
        let md = dir.join(format!("target-{k}.md"));
        let mut child = std::process::Command::new(std::env::current_exe().expect("exe"))
            .args(["--ignored", "--exact", entry, "--nocapture"])
            .env(ROLE, LANDED_TARGET)
            .env("NIXL_LANDED_MD", &md)
            .env("NIXL_LANDED_LEN", len.to_string())
            .env("NIXL_LANDED_SEED", seed.to_string())
            .spawn()
            .expect("spawn the target");
        let end = Instant::now() + WAIT;
        while !md.exists() && Instant::now() < end {
            assert!(
                child.try_wait().expect("wait").is_none(),
                "the target exited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let bytes = std::fs::read(&md).expect("the target's metadata");
        let peer = a.load_remote_metadata(&bytes).expect("load the target");
        let rbase = a
            .remote_regions(&peer)
            .expect("regions")
            .iter()
            .find(|r| r.kind == MemKind::Vram)
            .expect("the target's VRAM")
            .addr;
        local.fill(0xEE).expect("sentinel");
        let n = len / KILL_BLOCK as usize;
        let req = a
            .create_xfer_req(
                op,
                &blocks(local.addr(), n),
                &blocks(rbase, n),
                &peer,
                XferOptions::default(),
            )
            .expect("request");
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        a.post_xfer_req(&req).expect("post");
        std::thread::sleep(Duration::from_micros(x % 600));
        child.kill().expect("kill");
        let _ = child.wait();
        let end = req.wait(WAIT);
        let what = match &end {
            Ok(()) => "Done".to_owned(),
            Err(e) => format!("{:?}", e.kind()),
        };
        if end.is_ok() && op == XferOp::Read {
            let mut got = vec![0u8; len];
            local.copy_to_host(0, &mut got).expect("read back");
            assert_eq!(
                first_diff(&got, &pattern(seed, len)),
                None,
                "kill {k}: a {len}-byte READ ended Done with bytes missing"
            );
        }
        if let Err(e) = req.wait_quiescent(Duration::from_secs(10)) {
            panic!("kill {k}: not quiescent 10 s after {what}: {e}");
        }
        local.fill(0xEE).expect("sentinel");
        std::thread::sleep(Duration::from_millis(200));
        let mut got = vec![0u8; len];
        local.copy_to_host(0, &mut got).expect("read back");
        assert!(
            got.iter().all(|&b| b == 0xEE),
            "kill {k}: the sentinel was written after quiescence"
        );
        *tally.entry(format!("{op:?} {what}")).or_default() += 1;
        drop(req);
        let _ = a.invalidate_remote_metadata(&peer);
        let _ = std::fs::remove_file(&md);
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{test}: {transport}, {kills} kills per operation: {tally:?}");
}

/// The target of [`killed_target_case`], in its own process: VRAM filled with its pattern,
/// registered with `a`, its metadata written to a file (atomically); then it waits to be
/// killed (or for its parent to go).
pub fn landed_target(a: &nixl_core::Agent) {
    let var = |k: &str| std::env::var(k).expect(k);
    let len: usize = var("NIXL_LANDED_LEN").parse().expect("length");
    let seed: u64 = var("NIXL_LANDED_SEED").parse().expect("seed");
    let t = std::sync::Arc::new(nixl_mem::DeviceBuffer::new(0, len).expect("VRAM"));
    t.copy_from_host(0, &pattern(seed, len)).expect("fill");
    let _r = a.register_mem(vec![t.clone()], &[]).expect("register");
    let md = std::path::PathBuf::from(var("NIXL_LANDED_MD"));
    let tmp = md.with_extension("tmp");
    std::fs::write(&tmp, a.local_metadata().expect("metadata")).expect("write");
    std::fs::rename(&tmp, &md).expect("rename");
    let parent = std::os::unix::process::parent_id();
    for _ in 0..6000 {
        if std::os::unix::process::parent_id() != parent {
            break;
        }
        // A UCX target over an emulated transport moves bytes only while it progresses.
        a.progress();
        std::thread::sleep(std::time::Duration::from_millis(1));
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
