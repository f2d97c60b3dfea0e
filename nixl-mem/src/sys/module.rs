//! A JIT-compiled PTX module and its one kernel (the copy kernel), unloaded on drop.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::cu;
use super::result::{bind_raw, check, CudaError};
use super::stream::Stream;

/// A loaded module and one of its functions, in one context.
pub(crate) struct KernelModule {
    ctx: Arc<CudaContext>,
    module: cu::CUmodule,
    func: cu::CUfunction,
}

// SAFETY: module and function handles are context-wide and may be used from any thread that
// has the context current; the owner binds it first, and cuLaunchKernel is thread-safe.
unsafe impl Send for KernelModule {}
// SAFETY: as above; the handles are never mutated after `load`.
unsafe impl Sync for KernelModule {}

impl KernelModule {
    /// JIT-compiles `ptx` in `ctx` (made current) and looks up the function `name`. On failure
    /// the error and the JIT log.
    pub(crate) fn load(
        ctx: Arc<CudaContext>,
        ptx: &CStr,
        name: &CStr,
    ) -> Result<Self, (CudaError, String)> {
        bind_raw(&ctx).map_err(|e| (e, String::new()))?;
        let mut log = vec![0u8; 8192];
        let mut opts = [
            cu::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            cu::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut vals: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as _];
        let mut module: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: the context is current; `ptx` is NUL-terminated and lives across the call;
        // the two options point at a live buffer of the stated size (the size option is passed
        // by value in the pointer, as the driver API specifies); `module` is a valid out
        // pointer.
        let r = unsafe {
            cu::cuModuleLoadDataEx(
                &mut module,
                ptx.as_ptr().cast(),
                opts.len() as u32,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        };
        if let Err(e) = check("cuModuleLoadDataEx", r) {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            return Err((e, String::from_utf8_lossy(&log[..end]).trim().to_owned()));
        }
        // From here the module is owned: dropped (unloaded) on every error path.
        let mut m = KernelModule {
            ctx,
            module,
            func: std::ptr::null_mut(),
        };
        let mut func: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is live; `name` is NUL-terminated; `func` is a valid out pointer.
        let r = unsafe { cu::cuModuleGetFunction(&mut func, m.module, name.as_ptr()) };
        check("cuModuleGetFunction", r).map_err(|e| (e, String::new()))?;
        m.func = func;
        Ok(m)
    }

    /// `cuOccupancyMaxActiveBlocksPerMultiprocessor` for blocks of `threads` threads.
    pub(crate) fn blocks_per_sm(&self, threads: u32) -> Result<i32, CudaError> {
        let mut per_sm = 0;
        // SAFETY: `func` is a live function of the module's context; valid out pointer.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            cu::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                self.func,
                threads as i32,
                0,
            )
        })?;
        Ok(per_sm)
    }

    /// Enqueues the function on `stream` with two `u64` parameters, `grid` x 1 x 1 blocks of
    /// `threads` threads. Crate invariant (the copy kernel's): `a` is a device array of `n`
    /// descriptors, stream-ordered before this launch, whose ranges are device memory this
    /// context can reach, alive until the launch completes, with no destination overlapping
    /// another descriptor's source or destination (`kernel::conflict`).
    pub(crate) fn launch2(
        &self,
        grid: u32,
        threads: u32,
        stream: &Stream,
        a: u64,
        n: u64,
    ) -> Result<(), CudaError> {
        self.launch_u64s(grid, threads, stream, [a, n])
    }

    /// Enqueues the function on `stream` with four `u64` parameters, `grid` x 1 x 1 blocks of
    /// `threads` threads. Crate invariant (the block kernel's): `args` are the layers' device
    /// array, the item count, the pieces' device array and the pieces per layer of a block
    /// table stream-ordered before this launch, whose generated copies are device memory this
    /// context can reach, alive until the launch completes, no two overlapping as in
    /// `kernel::conflict`.
    pub(crate) fn launch4(
        &self,
        grid: u32,
        threads: u32,
        stream: &Stream,
        args: [u64; 4],
    ) -> Result<(), CudaError> {
        self.launch_u64s(grid, threads, stream, args)
    }

    /// Enqueues the function with three `u64` parameters (the segment kernel's two and its
    /// counter). Crate invariant as [`Self::launch2`], and the counter is a `u64` of device
    /// memory this context can reach, alive until the launch completes.
    pub(crate) fn launch3(
        &self,
        grid: u32,
        threads: u32,
        stream: &Stream,
        args: [u64; 3],
    ) -> Result<(), CudaError> {
        self.launch_u64s(grid, threads, stream, args)
    }

    /// Enqueues the function with five `u64` parameters (the arrival kernels: a table's four
    /// and the counters). Crate invariant as [`Self::launch4`], and the counters are `u64`s of
    /// device memory this context can reach, one per layer of the table, alive until the
    /// launch completes.
    pub(crate) fn launch5(
        &self,
        grid: u32,
        threads: u32,
        stream: &Stream,
        args: [u64; 5],
    ) -> Result<(), CudaError> {
        self.launch_u64s(grid, threads, stream, args)
    }

    /// The launch behind [`Self::launch2`] and [`Self::launch4`]: `N` `u64` parameters, which
    /// must match the kernel's `N` `.u64` parameters; the memory the kernel touches is the
    /// caller's crate invariant.
    fn launch_u64s<const N: usize>(
        &self,
        grid: u32,
        threads: u32,
        stream: &Stream,
        mut args: [u64; N],
    ) -> Result<(), CudaError> {
        let mut params: [*mut c_void; N] = [std::ptr::null_mut(); N];
        for (p, a) in params.iter_mut().zip(args.iter_mut()) {
            *p = (a as *mut u64).cast();
        }
        // SAFETY: the function belongs to this context and the stream too; `params` points at
        // `N` live u64 values matching the kernel's `N` .u64 parameters (the driver copies them
        // before returning; `args` outlives the call); the memory the kernel touches is the
        // caller's crate invariant (see `launch2`, `launch4`).
        check("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(
                self.func,
                grid,
                1,
                1,
                threads,
                1,
                1,
                0,
                stream.raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

impl Drop for KernelModule {
    fn drop(&mut self) {
        if let Err(e) = bind_raw(&self.ctx) {
            tracing::warn!(error = %e, "binding the context to unload the copy kernel failed");
        }
        // SAFETY: loaded in `load`, unloaded once; requests using the kernel hold an `Arc` of
        // its owner and wait for their streams before they drop it.
        if let Err(e) = check("cuModuleUnload", unsafe { cu::cuModuleUnload(self.module) }) {
            tracing::warn!(error = %e, "cuModuleUnload failed");
        }
    }
}
