//! The `CUDA_IPC` backend's parameters: typed, and the string-map form.

use std::collections::BTreeMap;
use std::time::Duration;

use nixl_core::backend::ParamMap;
use nixl_core::{Error, Op, Result};

use super::{KernelShape, CUDA_IPC};

/// Parameters of the `CUDA_IPC` backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaIpcParams {
    /// The default GPU: where requests between host memory run, and where a peer's GPU memory
    /// is mapped first. A request with local GPU memory runs on that memory's GPU, whichever
    /// it is (one backend serves every GPU of the process; see `gpu`).
    pub device: usize,
    /// Page-lock DRAM regions at registration (`cuMemHostRegister`); without it DRAM copies are
    /// staged by the driver and much slower.
    pub pin_host: bool,
    /// Enqueue a request of many segments with one `cuMemcpyBatchAsync` (CUDA 12.8+ drivers;
    /// falls back to one `cuMemcpyAsync` per segment when refused).
    pub batch_copies: bool,
    /// How long `cancel` waits for copies already handed to the GPU.
    pub cancel_timeout: Duration,
    /// Copy VRAM<->VRAM requests of many segments with the scatter-gather copy kernel (on the
    /// SMs) instead of the copy engines.
    pub copy_kernel: bool,
    /// The fewest segments a request needs for the copy kernel (fewer go to `cuMemcpyAsync`).
    pub kernel_min_segments: usize,
    /// The copy kernel's shape; validated when the backend is created.
    pub kernel_shape: KernelShape,
    /// Accept copies that can only run slower than the hardware allows: a VRAM request the
    /// copy kernel would take, left to the copy engines because two GPUs have no peer access
    /// or the kernel does not load. Off: such a request is refused with `NotSupported` naming
    /// the GPUs and the reason (its path would otherwise say only how slow it went).
    pub allow_copy_engines: bool,
}

nixl_core::__setters!(CudaIpcParams {
    device: usize,
    pin_host: bool,
    batch_copies: bool,
    cancel_timeout: Duration,
    copy_kernel: bool,
    kernel_min_segments: usize,
    kernel_shape: KernelShape,
    allow_copy_engines: bool,
});

impl Default for CudaIpcParams {
    fn default() -> Self {
        CudaIpcParams {
            device: 0,
            pin_host: true,
            batch_copies: true,
            cancel_timeout: Duration::from_secs(10),
            copy_kernel: true,
            kernel_min_segments: 3,
            kernel_shape: KernelShape::default(),
            allow_copy_engines: false,
        }
    }
}

/// Creates `CUDA_IPC` by name from a string map: `device` (GPU ordinal), `pin_host`,
/// `batch_copies` and `copy_kernel` (`true`/`false`), `cancel_timeout_ms`,
/// `kernel_min_segments`, `allow_copy_engines`, `kernel_shape` ([`KernelShape`]'s text form, e.g.
/// `chunk=512k,ctas=2,threads=1024,unroll=8,load=plain,store=cs,schedule=balanced`).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaIpcPlugin;

impl CudaIpcParams {
    /// The string-map form of the defaults (the plugin's `default_params`).
    pub(crate) fn default_map() -> BTreeMap<String, String> {
        let d = CudaIpcParams::default();
        BTreeMap::from([
            ("device".to_owned(), d.device.to_string()),
            ("pin_host".to_owned(), d.pin_host.to_string()),
            ("batch_copies".to_owned(), d.batch_copies.to_string()),
            (
                "cancel_timeout_ms".to_owned(),
                d.cancel_timeout.as_millis().to_string(),
            ),
            ("copy_kernel".to_owned(), d.copy_kernel.to_string()),
            (
                "kernel_min_segments".to_owned(),
                d.kernel_min_segments.to_string(),
            ),
            ("kernel_shape".to_owned(), d.kernel_shape.to_string()),
            (
                "allow_copy_engines".to_owned(),
                d.allow_copy_engines.to_string(),
            ),
        ])
    }

    /// Parses the string-map form (the plugin's `parse_params`).
    pub(crate) fn from_map(params: &BTreeMap<String, String>) -> Result<Self> {
        let mut m = ParamMap::new(CUDA_IPC, params);
        let mut p = CudaIpcParams::default();
        if let Some(d) = m.parse("device", "a device ordinal")? {
            p.device = d;
        }
        if let Some(b) = m.bool("pin_host")? {
            p.pin_host = b;
        }
        if let Some(b) = m.bool("batch_copies")? {
            p.batch_copies = b;
        }
        if let Some(d) = m.millis("cancel_timeout_ms")? {
            p.cancel_timeout = d;
        }
        if let Some(b) = m.bool("copy_kernel")? {
            p.copy_kernel = b;
        }
        if let Some(n) = m.usize("kernel_min_segments")? {
            p.kernel_min_segments = n;
        }
        if let Some(b) = m.bool("allow_copy_engines")? {
            p.allow_copy_engines = b;
        }
        if let Some(shape) = m.str("kernel_shape") {
            p.kernel_shape = shape
                .parse()
                .map_err(|why| Error::invalid("", Op::CreateBackend, format!("CUDA_IPC {why}")))?;
        }
        m.finish()?;
        Ok(p)
    }
}

nixl_core::__backend_plugin!(CudaIpcPlugin, CudaIpcParams, CUDA_IPC, |p, ctx| {
    super::CudaIpcBackend::new(ctx, p)
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda;
    use nixl_core::backend::BackendPlugin;

    #[test]
    fn plugin_parses_typed_params_and_refuses_bad_ones() {
        let p = CudaIpcPlugin;
        assert_eq!(p.name(), CUDA_IPC);
        let d = p.default_params();
        assert_eq!(d["device"], "0");
        assert!(p.parse_params(&d).is_ok());
        for (k, v) in [
            ("device", "x"),
            ("pin_host", "maybe"),
            ("copy_kernel", "sometimes"),
            ("kernel_min_segments", "-3"),
            ("kernel_shape", "threads=48"),
            ("kernel_shape", "chunk=1k"),
            ("kernel_shape", "colour=red"),
            ("nope", "1"),
            ("cancel_timeout_ms", "-1"),
        ] {
            let m = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            assert_eq!(
                p.parse_params(&m).err().map(|e| e.kind().as_str()),
                Some("invalid_param"),
                "{k}={v}"
            );
        }
    }

    /// A shape out of range is refused, typed, before the driver is touched (with or
    /// without a GPU), and the agent has no backend after it.
    #[test]
    fn a_bad_kernel_shape_is_invalid_and_creates_nothing() {
        let a = nixl_core::Agent::new("a", nixl_core::AgentConfig::default()).unwrap();
        for shape in [
            KernelShape {
                threads: 100,
                ..Default::default()
            },
            KernelShape {
                unroll: 0,
                ..Default::default()
            },
            KernelShape {
                chunk: 1000,
                ..Default::default()
            },
            KernelShape {
                ctas_per_sm: 0,
                ..Default::default()
            },
        ] {
            let e = a
                .create_backend(CudaIpcParams {
                    kernel_shape: shape,
                    ..Default::default()
                })
                .unwrap_err();
            assert_eq!(e.kind().as_str(), "invalid_param", "{e}");
            assert!(a.backends().is_empty());
        }
        let m = BTreeMap::from([(
            "kernel_shape".to_owned(),
            "chunk=512k,ctas=2,threads=1024,unroll=8,load=plain,store=wb,schedule=balanced"
                .to_owned(),
        )]);
        assert!(CudaIpcPlugin.parse_params(&m).is_ok());
    }

    #[test]
    fn creating_without_cuda_is_unavailable() {
        if cuda::is_available() {
            eprintln!("CUDA present: backend creation is covered by tests/gpu.rs");
            return;
        }
        let a = nixl_core::Agent::new("a", nixl_core::AgentConfig::default()).unwrap();
        let e = a.create_backend(CudaIpcParams::default()).unwrap_err();
        assert_eq!(e.kind().as_str(), "unavailable", "{e}");
        assert!(a.backends().is_empty());
    }
}
