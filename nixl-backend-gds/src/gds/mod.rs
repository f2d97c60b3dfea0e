//! GPUDirect Storage (cuFile): in progress.
