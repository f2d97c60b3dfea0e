//! Loading the kernels into a context and launching them.

#[allow(unused_imports)]
use super::*;

/// Which table kernel a launch runs: whole blocks, or tiles with their rows rearranged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableKernel {
    Blocks,
    Tiles,
}

/// The loaded module (unloaded on drop) and its kernel, for one context.
pub(crate) struct CopyKernel {
    module: KernelModule,
    /// The block kernel (same shape), where it loaded.
    blocks: Option<KernelModule>,
    /// The tile kernel (same threads and hints), where it loaded.
    tiles: Option<KernelModule>,
    /// The block and tile kernels with per-layer arrival counters, where they loaded.
    blocks_arrival: Option<KernelModule>,
    tiles_arrival: Option<KernelModule>,
    segments_arrival: Option<KernelModule>,
    shape: KernelShape,
    /// CTAs of the shape resident on the whole GPU at once.
    resident: u32,
}

impl CopyKernel {
    /// JIT-compiles the PTX of `shape` (already validated) for GPU `ordinal` in `ctx`. The
    /// error says why, with the JIT log.
    pub(crate) fn load(
        ctx: Arc<CudaContext>,
        ordinal: usize,
        shape: KernelShape,
    ) -> Result<Self, String> {
        shape.validate()?;
        bind(&ctx).map_err(|e| e.to_string())?;
        let text = ptx(&shape);
        let text = CStr::from_bytes_with_nul(text.as_bytes())
            .map_err(|_| "the PTX is not one NUL-terminated string".to_owned())?;
        let module = KernelModule::load(ctx.clone(), text, NAME).map_err(|(e, log)| {
            if e.call == "cuModuleLoadDataEx" {
                format!("{e}: {log}")
            } else {
                e.to_string()
            }
        })?;
        let resident = occupancy(&module, ordinal, &shape).map_err(|e| e.to_string())?;
        // The block kernel is optional: without it block tables are written out as
        // descriptors for the segment kernel.
        let optional = |text: String, name: &CStr| {
            CStr::from_bytes_with_nul(text.as_bytes())
                .map_err(|_| "the PTX is not one NUL-terminated string".to_owned())
                .and_then(|t| {
                    KernelModule::load(ctx.clone(), t, name)
                        .map_err(|(e, log)| format!("{e}: {log}"))
                })
        };
        let blocks = optional(ptx_blocks(&shape), BLOCKS_NAME)
            .inspect_err(|e| tracing::warn!(error = %e, "the block-table copy kernel did not load; block tables use the segment kernel"))
            .ok();
        // Without the tile kernel, tile requests are refused (nothing else rearranges rows).
        let tiles = optional(ptx_tiles(&shape), TILES_NAME)
            .inspect_err(|e| tracing::warn!(error = %e, "the tile copy kernel did not load; tile transfers are refused"))
            .ok();
        let arrival = |text: String, name: &CStr| {
            optional(text, name)
                .inspect_err(|e| tracing::warn!(error = %e, "an arrival-counter copy kernel did not load; requests with arrival counters are refused"))
                .ok()
        };
        let blocks_arrival = arrival(ptx_blocks_arrival(&shape), c"nixl_copy_blocks_arrival");
        let tiles_arrival = arrival(ptx_tiles_arrival(&shape), c"nixl_copy_tiles_arrival");
        let segments_arrival = arrival(ptx_segments_arrival(&shape), c"nixl_copy_segments_arrival");
        Ok(CopyKernel {
            module,
            blocks,
            tiles,
            blocks_arrival,
            tiles_arrival,
            segments_arrival,
            shape,
            resident,
        })
    }

    /// The shape it was compiled for.
    pub(crate) fn shape(&self) -> &KernelShape {
        &self.shape
    }

    /// The grid for `count` descriptors cut one by one (see [`grid`]).
    pub(crate) fn grid(&self, count: u64) -> u32 {
        grid(&self.shape, count, self.resident)
    }

    /// The descriptors and grid for `segments` (see [`plan`]).
    pub(crate) fn plan(&self, segments: &[Segment]) -> (Vec<Segment>, u32) {
        plan(segments, &self.shape, self.resident)
    }

    /// Whether the tile kernel loaded.
    pub(crate) fn has_tiles(&self) -> bool {
        self.tiles.is_some()
    }

    /// The grid for a tile table of `items` tiles: one CTA per tile, at most the largest grid.
    pub(crate) fn tile_grid(&self, items: u64) -> u32 {
        u32::try_from(items.clamp(1, MAX_GRID)).unwrap_or(1)
    }

    /// Whether the kernels taking arrival counters loaded (segments, blocks, tiles).
    pub(crate) fn has_arrival(&self) -> (bool, bool, bool) {
        (
            self.segments_arrival.is_some(),
            self.blocks_arrival.is_some(),
            self.tiles_arrival.is_some(),
        )
    }

    /// Whether the block kernel loaded.
    pub(crate) fn has_blocks(&self) -> bool {
        self.blocks.is_some()
    }

    /// Enqueues the table kernel `which` over the table at device address `table` laid out as
    /// `layout` on `stream`, `grid` CTAs of the shape's threads: the block kernel generates
    /// every copy from the layers and the ids' runs, the tile kernel copies every tile's rows
    /// where the destination wants them (its tiles at `table + tiles_at`).
    ///
    /// Crate invariant (see `crate::sys`): `table` holds the table (stream-ordered before this
    /// launch), whose generated copies (rows, for tiles) are device memory this context can
    /// reach, alive until the launch completes, no two in [`conflict`] (no destination row
    /// meeting another row of the launch).
    pub(crate) fn launch_over_table(
        &self,
        which: TableKernel,
        table: u64,
        layout: &BlockLayout,
        grid: u32,
        stream: &Stream,
        counters: Option<u64>,
    ) -> Result<(), CudaError> {
        let (m, name) = match (which, counters.is_some()) {
            (TableKernel::Blocks, false) => (&self.blocks, "block-table"),
            (TableKernel::Blocks, true) => (&self.blocks_arrival, "block-table"),
            (TableKernel::Tiles, false) => (&self.tiles, "tile"),
            (TableKernel::Tiles, true) => (&self.tiles_arrival, "tile"),
        };
        launch_table(
            m.as_ref(),
            name,
            (table, layout),
            grid,
            self.shape.threads,
            stream,
            counters,
        )
    }

    /// Enqueues the kernel over `count` descriptors at device address `descs` on `stream`,
    /// `grid` CTAs of the shape's threads.
    ///
    /// Crate invariant (see `crate::sys`): `descs` holds `count` descriptors (stream-ordered
    /// before this launch) whose ranges are device memory this context can reach, live until
    /// the launch completes, with no destination overlapping another descriptor's source or
    /// destination (see [`conflict`]).
    pub(crate) fn launch(
        &self,
        descs: u64,
        count: u64,
        grid: u32,
        stream: &Stream,
        counter: Option<u64>,
    ) -> Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        match counter {
            None => self
                .module
                .launch2(grid.max(1), self.shape.threads, stream, descs, count),
            Some(c) => match &self.segments_arrival {
                Some(m) => m.launch3(grid.max(1), self.shape.threads, stream, [descs, count, c]),
                None => Err(CudaError {
                    call: "cuLaunchKernel",
                    code: sys::CUresult::CUDA_ERROR_NOT_FOUND as u32,
                    name: "the segment copy kernel with a counter is not loaded".to_owned(),
                }),
            },
        }
    }
}

/// Launches a table kernel (blocks or tiles, `what` for the error where it did not load) with
/// its four parameters, and the counters where it is an arrival kernel; nothing for an empty
/// table.
fn launch_table(
    m: Option<&KernelModule>,
    what: &str,
    (table, layout): (u64, &BlockLayout),
    grid: u32,
    threads: u32,
    stream: &Stream,
    counters: Option<u64>,
) -> Result<(), CudaError> {
    let Some(m) = m else {
        return Err(CudaError {
            call: "cuLaunchKernel",
            code: sys::CUresult::CUDA_ERROR_NOT_FOUND as u32,
            name: format!("the {what} copy kernel is not loaded"),
        });
    };
    if layout.items == 0 {
        return Ok(());
    }
    let args = [
        table,
        layout.items,
        table + layout.pieces_at as u64,
        layout.npieces,
    ];
    match counters {
        None => m.launch4(grid.max(1), threads, stream, args),
        Some(c) => {
            let [a, b, d, e] = args;
            m.launch5(grid.max(1), threads, stream, [a, b, d, e, c])
        }
    }
}

pub(super) fn occupancy(
    module: &KernelModule,
    ordinal: usize,
    shape: &KernelShape,
) -> Result<u32, CudaError> {
    let per_sm = module.blocks_per_sm(shape.threads)?;
    let sms = device_attribute(
        ordinal,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )?;
    let per_sm = per_sm.clamp(1, shape.ctas_per_sm as i32);
    Ok(u32::try_from(sms.max(1) * per_sm).unwrap_or(1))
}
