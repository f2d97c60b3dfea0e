//! `OBJ`: DRAM <-> S3 object transfers through `object_store` (feature `s3`).
//!
//! An OBJ registration maps a region to an object key ([`crate::ObjectRegion`]); descriptors
//! name byte ranges of the object. READs fetch ranges (large ones split into parallel ranged
//! GETs); WRITEs upload whole objects: the descriptors of one object must cover `[0, n)`
//! without gaps, and objects over [`S3Params::multipart_threshold`] go up as a multipart
//! upload with parts sent in parallel. The backend owns a tokio runtime; every request has
//! bounded retries and timeouts, and errors are typed: a missing object is
//! [`Error::NotFound`], refused credentials [`Error::NotAllowed`], an endpoint that cannot be
//! reached [`Error::Unavailable`].

mod errors;
mod xfer;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendXfer, ParamMap, XferSpec,
};
use nixl_core::backend::{Capabilities, QueryResult};
use nixl_core::{Error, MemKind, Op, RegionDesc, Result};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStoreExt, RetryConfig};

use crate::storage::Storage;

pub(crate) use errors::map_error;

/// The backend's type name (NIXL's object-store plugin).
pub const OBJ: &str = "OBJ";

/// OBJ as the storage checks see it.
const STORAGE: Storage = Storage {
    name: OBJ,
    targets: "objects",
    local: &[MemKind::Dram],
    remote: &[MemKind::Object],
};

/// Parameters of the S3 backend. Unset fields fall back to the usual `AWS_*` environment
/// variables (`AWS_ENDPOINT_URL`/`AWS_ENDPOINT`, `AWS_BUCKET`, `AWS_REGION`/`AWS_DEFAULT_REGION`,
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).
#[derive(Clone)]
#[non_exhaustive]
pub struct S3Params {
    /// The endpoint URL (`http://127.0.0.1:9000`); `None` for AWS itself.
    pub endpoint: Option<String>,
    /// The bucket.
    pub bucket: Option<String>,
    /// The region.
    pub region: Option<String>,
    /// The access key id.
    pub access_key_id: Option<String>,
    /// The secret access key.
    pub secret_access_key: Option<String>,
    /// A session token.
    pub session_token: Option<String>,
    /// Use virtual-hosted-style URLs (`bucket.host`) instead of path style.
    pub virtual_hosted_style: bool,
    /// Objects written with more bytes than this use a multipart upload.
    pub multipart_threshold: u64,
    /// Part size of multipart uploads and of the ranged GETs a large READ is split into (at
    /// least 5 MiB, S3's minimum part).
    pub part_size: u64,
    /// Requests (parts, ranges, objects) in flight per transfer.
    pub max_concurrency: usize,
    /// Retries of a failed request (connection errors, 5xx, throttling).
    pub max_retries: usize,
    /// No retry starts later than this after the first attempt.
    pub retry_timeout: Duration,
    /// Timeout of one HTTP request.
    pub request_timeout: Duration,
    /// Timeout of establishing a connection.
    pub connect_timeout: Duration,
    /// How long `query` and cancel wait.
    pub op_timeout: Duration,
    /// Worker threads of the backend's tokio runtime.
    pub worker_threads: usize,
}

nixl_core::__setters!(S3Params {
    virtual_hosted_style: bool,
    multipart_threshold: u64,
    part_size: u64,
    max_concurrency: usize,
    max_retries: usize,
    retry_timeout: Duration,
    request_timeout: Duration,
    connect_timeout: Duration,
    op_timeout: Duration,
    worker_threads: usize,
} some {
    endpoint: String,
    bucket: String,
    region: String,
    access_key_id: String,
    secret_access_key: String,
    session_token: String,
});

impl Default for S3Params {
    fn default() -> Self {
        S3Params {
            endpoint: None,
            bucket: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            virtual_hosted_style: false,
            multipart_threshold: 32 << 20,
            part_size: 8 << 20,
            max_concurrency: 16,
            max_retries: 3,
            retry_timeout: Duration::from_secs(20),
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(3),
            op_timeout: Duration::from_secs(30),
            worker_threads: 2,
        }
    }
}

impl std::fmt::Debug for S3Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Params")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field("multipart_threshold", &self.multipart_threshold)
            .field("part_size", &self.part_size)
            .field("max_concurrency", &self.max_concurrency)
            .finish_non_exhaustive()
    }
}

impl S3Params {
    fn validate(&self, agent: &str) -> Result<()> {
        let bad = |r: &str| {
            Err(Error::invalid(
                agent,
                Op::CreateBackend,
                format!("OBJ: {r}"),
            ))
        };
        if self.part_size < 5 << 20 || self.part_size > 5 << 30 {
            return bad("part_size must be between 5 MiB and 5 GiB");
        }
        if self.multipart_threshold < self.part_size {
            return bad("multipart_threshold must be at least part_size");
        }
        if self.max_concurrency == 0 || self.max_concurrency > 1024 {
            return bad("max_concurrency must be in 1..=1024");
        }
        if self.worker_threads == 0 || self.worker_threads > 256 {
            return bad("worker_threads must be in 1..=256");
        }
        if self.max_retries > 100 {
            return bad("max_retries must be at most 100");
        }
        Ok(())
    }

    fn build(&self, agent: &str) -> Result<AmazonS3> {
        let mut b = AmazonS3Builder::from_env();
        if let Some(v) = &self.endpoint {
            b = b.with_endpoint(v);
        }
        if let Some(v) = &self.bucket {
            b = b.with_bucket_name(v);
        }
        if let Some(v) = &self.region {
            b = b.with_region(v);
        }
        if let Some(v) = &self.access_key_id {
            b = b.with_access_key_id(v);
        }
        if let Some(v) = &self.secret_access_key {
            b = b.with_secret_access_key(v);
        }
        if let Some(v) = &self.session_token {
            b = b.with_token(v);
        }
        let endpoint = self
            .endpoint
            .clone()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .or_else(|| std::env::var("AWS_ENDPOINT").ok());
        let http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        b = b
            .with_virtual_hosted_style_request(self.virtual_hosted_style)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(50),
                    max_backoff: Duration::from_secs(2),
                    base: 2.0,
                },
                max_retries: self.max_retries,
                retry_timeout: self.retry_timeout,
            })
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(http)
                    .with_timeout(self.request_timeout)
                    .with_connect_timeout(self.connect_timeout),
            );
        b.build()
            .map_err(|e| Error::invalid(agent, Op::CreateBackend, format!("OBJ: {e}")))
    }
}

/// Creates `OBJ` by name from string parameters: `endpoint_override` (or `endpoint`),
/// `bucket`, `region`, `access_key`, `secret_key`, `session_token`, `multipart_threshold`,
/// `part_size`, `max_concurrency`, `max_retries`, `request_timeout_ms`,
/// `connect_timeout_ms`, `worker_threads`.
#[derive(Debug, Clone, Copy, Default)]
pub struct S3Plugin;

impl S3Params {
    /// The string-map form of the defaults (the plugin's `default_params`).
    pub(crate) fn default_map() -> BTreeMap<String, String> {
        let d = S3Params::default();
        BTreeMap::from([
            (
                "multipart_threshold".to_owned(),
                d.multipart_threshold.to_string(),
            ),
            ("part_size".to_owned(), d.part_size.to_string()),
            ("max_concurrency".to_owned(), d.max_concurrency.to_string()),
            ("max_retries".to_owned(), d.max_retries.to_string()),
        ])
    }

    /// Parses the string-map form (the plugin's `parse_params`).
    pub(crate) fn from_map(params: &BTreeMap<String, String>) -> Result<Self> {
        let mut m = ParamMap::new(OBJ, params);
        // NIXL's name first, then the short one.
        let (over, plain) = (m.string("endpoint_override"), m.string("endpoint"));
        let mut p = S3Params {
            endpoint: over.or(plain),
            bucket: m.string("bucket"),
            region: m.string("region"),
            access_key_id: m.string("access_key"),
            secret_access_key: m.string("secret_key"),
            session_token: m.string("session_token"),
            ..S3Params::default()
        };
        // NIXL's OBJ plugin: `scheme` (http/https) applies to an endpoint given without one.
        let schemes = [("http", "http"), ("https", "https")];
        if let Some(scheme) = m.choice("scheme", &schemes)? {
            if let Some(e) = p.endpoint.as_mut().filter(|e| !e.contains("://")) {
                *e = format!("{scheme}://{e}");
            }
        }
        if let Some(b) = m.bool("use_virtual_addressing")? {
            p.virtual_hosted_style = b;
        }
        if let Some(n) = m.u64("multipart_threshold")? {
            p.multipart_threshold = n;
        }
        if let Some(n) = m.u64("part_size")? {
            p.part_size = n;
        }
        if let Some(n) = m.usize("max_concurrency")? {
            p.max_concurrency = n;
        }
        if let Some(n) = m.usize("max_retries")? {
            p.max_retries = n;
        }
        if let Some(d) = m.millis("request_timeout_ms")? {
            p.request_timeout = d;
        }
        if let Some(d) = m.millis("connect_timeout_ms")? {
            p.connect_timeout = d;
        }
        if let Some(n) = m.usize("worker_threads")? {
            p.worker_threads = n;
        }
        m.finish()?;
        p.validate("")?;
        Ok(p)
    }
}

nixl_core::__backend_plugin!(S3Plugin, S3Params, OBJ, |p, ctx| S3Backend::new(p, ctx));

/// Backend metadata of a registered DRAM region.
struct DramMd;

/// Backend metadata of a registered object.
pub(crate) struct ObjMd {
    pub key: String,
    pub path: ObjPath,
}

/// The runtime, shut down in the background when the last holder goes (so dropping the
/// backend inside someone's async context cannot panic).
pub(crate) struct Runtime(Option<tokio::runtime::Runtime>);

impl Runtime {
    pub(crate) fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.0.as_ref().map(|r| r.handle())
    }

    /// Runs `fut` on the runtime and waits for it on this thread, at most `timeout`. Works
    /// from any thread, including a tokio worker of another runtime.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        agent: &str,
        op: Op,
        timeout: Duration,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let h = self
            .handle()
            .ok_or_else(|| Error::not_allowed(agent, op, "OBJ runtime is shut down"))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let task = h.spawn(async move {
            let _ = tx.send(fut.await);
        });
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(_) => {
                task.abort();
                Err(Error::TimedOut {
                    agent: agent.to_owned(),
                    op,
                    elapsed: timeout,
                })
            }
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The S3 backend.
pub struct S3Backend {
    agent: String,
    params: S3Params,
    store: Arc<AmazonS3>,
    rt: Arc<Runtime>,
    endpoint: String,
}

impl std::fmt::Debug for S3Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Backend")
            .field("agent", &self.agent)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl S3Backend {
    /// Creates the backend (no request is made until the first transfer or query).
    pub fn new(params: S3Params, ctx: BackendContext) -> Result<Self> {
        params.validate(&ctx.agent)?;
        let store = Arc::new(params.build(&ctx.agent)?);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(params.worker_threads)
            .thread_name("nixl-obj")
            .enable_all()
            .build()
            .map_err(|e| Error::io(&ctx.agent, Op::CreateBackend, e))?;
        let endpoint = params
            .endpoint
            .clone()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .unwrap_or_else(|| "AWS".to_owned());
        Ok(S3Backend {
            agent: ctx.agent,
            params,
            store,
            rt: Arc::new(Runtime(Some(rt))),
            endpoint,
        })
    }

    /// Whether the object `key` exists, and its size.
    pub fn head(&self, key: &str) -> Result<QueryResult> {
        let missing = QueryResult {
            exists: false,
            size: None,
        };
        self.on_object(key, Op::QueryMem, Some(missing), |store, path| async move {
            store.head(&path).await.map(|m| QueryResult {
                exists: true,
                size: Some(m.size),
            })
        })
    }

    /// The entity tag (ETag) the server gives object `key` (`None` if it has none). For an
    /// object written by a multipart upload, S3 makes it `"<hash>-<parts>"`: the number of
    /// parts the upload had.
    pub fn etag(&self, key: &str) -> Result<Option<String>> {
        self.on_object(key, Op::QueryMem, None, |store, path| async move {
            store.head(&path).await.map(|m| m.e_tag)
        })
    }

    /// Deletes the object `key` (missing objects are not an error).
    pub fn delete(&self, key: &str) -> Result<()> {
        self.on_object(key, Op::DeregisterMem, Some(()), |store, path| async move {
            store.delete(&path).await
        })
    }

    /// Runs `f` on object `key` within the operation timeout; a missing object gives
    /// `missing` where there is one, and an error otherwise.
    fn on_object<T, F, Fut>(&self, key: &str, op: Op, missing: Option<T>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<AmazonS3>, ObjPath) -> Fut,
        Fut: Future<Output = std::result::Result<T, object_store::Error>> + Send + 'static,
    {
        let path = ObjPath::parse(key)
            .map_err(|e| Error::invalid(&self.agent, op, format!("object key {key:?}: {e}")))?;
        let (agent, endpoint) = (self.agent.clone(), self.endpoint.clone());
        let fut = f(self.store.clone(), path);
        self.rt
            .run(&self.agent, op, self.params.op_timeout, async move {
                match (fut.await, missing) {
                    (Ok(v), _) => Ok(v),
                    (Err(object_store::Error::NotFound { .. }), Some(v)) => Ok(v),
                    (Err(e), _) => Err(map_error(&agent, &endpoint, op, e)),
                }
            })
    }
}

fn key_of(agent: &str, op: Op, region: &RegionDesc) -> Result<(String, ObjPath)> {
    let key = std::str::from_utf8(&region.meta)
        .map_err(|_| Error::invalid(agent, op, "object key is not UTF-8"))?;
    if key.is_empty() {
        return Err(Error::invalid(
            agent,
            op,
            "an OBJ region names its key in RegionDesc::meta (use ObjectRegion)",
        ));
    }
    let path = ObjPath::parse(key)
        .map_err(|e| Error::invalid(agent, op, format!("object key {key:?}: {e}")))?;
    Ok((key.to_owned(), path))
}

impl Backend for S3Backend {
    fn name(&self) -> &str {
        OBJ
    }

    fn capabilities(&self) -> Capabilities {
        STORAGE.capabilities()
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        match region.kind {
            MemKind::Dram => Ok(Arc::new(DramMd)),
            MemKind::Object => {
                let (key, path) = key_of(&self.agent, Op::RegisterMem, region)?;
                Ok(Arc::new(ObjMd { key, path }))
            }
            k => Err(STORAGE.refuse_region(&self.agent, k)),
        }
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        STORAGE.check_deregister(
            &self.agent,
            downcast_md::<DramMd>(&md).is_some() || downcast_md::<ObjMd>(&md).is_some(),
        )
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        let me = &self.agent;
        STORAGE.check_request(me, spec)?;
        for (i, s) in spec.segments.iter().enumerate() {
            STORAGE.segment_md::<DramMd>(me, (i, "local"), spec.md(s.local_md), "DRAM")?;
        }
        let plan = xfer::Plan::new(me, spec, &self.params)?;
        Ok(Box::new(xfer::S3Xfer::new(
            plan,
            self.store.clone(),
            self.rt.clone(),
            self.endpoint.clone(),
            self.params.op_timeout,
        )))
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        (remote == self.agent).then(|| {
            format!(
                "S3 at {} (object_store, {} in flight)",
                self.endpoint, self.params.max_concurrency
            )
        })
    }

    fn query(&self, region: &RegionDesc) -> Result<Option<QueryResult>> {
        if region.kind != MemKind::Object {
            return Ok(None);
        }
        let (key, _) = key_of(&self.agent, Op::QueryMem, region)?;
        self.head(&key).map(Some)
    }
}
