//! OBJ transfers: a plan of ranged GETs and whole-object PUTs, run as one task on the
//! backend's runtime per post.
//!
//! Stopping one (cancel, drop, or its deadline: `abandon`) never leaves work behind: work not
//! started yet is skipped, and a multipart upload in progress is aborted
//! (`AbortMultipartUpload`) before the task ends, so no orphaned part stays billed on the
//! server. `cancel` waits (up to `cancel_timeout`) for that; past it, the task is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt, TryStreamExt};
use nixl_core::backend::{downcast_md, BackendXfer, MdTable, XferSpec};
use nixl_core::{Error, Op, Result, XferOp, XferState};
use object_store::aws::AmazonS3;
use object_store::path::Path as ObjPath;
use object_store::{MultipartUpload, ObjectStoreExt, PutPayload};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{map_error, ObjMd, Runtime, S3Params};

/// One unit of work.
enum Task {
    /// A ranged GET of `len` bytes at `off` into DRAM at `dst`.
    Get {
        path: ObjPath,
        off: u64,
        len: u64,
        dst: u64,
    },
    /// A PUT of a whole object gathered from DRAM pieces `(addr, len)`, `total` bytes.
    Put {
        path: ObjPath,
        pieces: Vec<(u64, u64)>,
        total: u64,
    },
}

/// The segments writing one object: key, path, and (object offset, DRAM address, length).
type ObjectWrite = (String, ObjPath, Vec<(u64, u64, u64)>);

/// What a prepared OBJ transfer does.
pub(crate) struct Plan {
    agent: String,
    tasks: Vec<Task>,
    multipart_threshold: u64,
    part_size: u64,
    max_concurrency: usize,
    /// Keeps the object registrations' metadata alive with the request.
    _objects: MdTable,
}

impl Plan {
    /// Checks the segments and builds the work list.
    pub(super) fn new(agent: &str, spec: &XferSpec, p: &S3Params) -> Result<Self> {
        let mut tasks = Vec::new();
        let mut writes: Vec<ObjectWrite> = Vec::new();
        for (i, s) in spec.segments.iter().enumerate() {
            let o = spec
                .md(s.remote_md)
                .and_then(downcast_md::<ObjMd>)
                .ok_or_else(|| {
                    Error::invalid(
                        agent,
                        Op::MakeXfer,
                        format!("segment {i}: target metadata is not an OBJ object"),
                    )
                })?;
            match spec.op {
                XferOp::Read => {
                    let mut done = 0;
                    while done < s.len {
                        let len = (s.len - done).min(p.part_size);
                        tasks.push(Task::Get {
                            path: o.path.clone(),
                            off: s.remote_addr + done,
                            len,
                            dst: s.local_addr + done,
                        });
                        done += len;
                    }
                }
                XferOp::Write => match writes.iter_mut().find(|(k, _, _)| *k == o.key) {
                    Some(w) => w.2.push((s.remote_addr, s.local_addr, s.len)),
                    None => writes.push((
                        o.key.clone(),
                        o.path.clone(),
                        vec![(s.remote_addr, s.local_addr, s.len)],
                    )),
                },
            }
        }
        for (key, path, mut segs) in writes {
            segs.sort_by_key(|s| s.0);
            let mut expect = 0u64;
            let mut pieces = Vec::with_capacity(segs.len());
            for (off, addr, len) in segs {
                if off != expect {
                    return Err(Error::invalid(
                        agent,
                        Op::MakeXfer,
                        format!("OBJ writes whole objects: the descriptors of {key:?} must cover [0, n) without gaps or overlaps (found offset {off}, expected {expect})"),
                    ));
                }
                pieces.push((addr, len));
                expect += len;
            }
            tasks.push(Task::Put {
                path,
                pieces,
                total: expect,
            });
        }
        Ok(Plan {
            agent: agent.to_owned(),
            tasks,
            multipart_threshold: p.multipart_threshold,
            part_size: p.part_size,
            max_concurrency: p.max_concurrency,
            _objects: spec.mds.clone(),
        })
    }
}

/// Copies `len` bytes at `offset` of the gathered DRAM pieces into a new vector.
fn gather(pieces: &[(u64, u64)], offset: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    let mut pos = 0u64;
    for &(addr, plen) in pieces {
        let (start, end) = (pos, pos + plen);
        pos = end;
        if end <= offset || start >= offset + len {
            continue;
        }
        let from = offset.max(start);
        let to = (offset + len).min(end);
        // Crate invariant: the piece lies in a DRAM registration the request keeps alive, and
        // the task reading it is aborted and awaited before the request lets go of it.
        crate::sys::io::append_from(addr + (from - start), (to - from) as usize, &mut out);
    }
    out
}

/// A post's stop signal: set by cancel or abandon, seen by every task of the post.
#[derive(Default)]
pub(crate) struct Stop {
    set: AtomicBool,
    notify: Notify,
}

impl Stop {
    fn stop(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Resolves once the post is stopped.
    async fn wait(&self) {
        loop {
            // Registered before the check: a `stop` in between still wakes it.
            let n = self.notify.notified();
            if self.is_set() {
                return;
            }
            n.await;
        }
    }
}

/// `f`'s output, or `Canceled` as soon as the post is stopped (`f` is dropped then: a GET's
/// bytes are not copied, a single PUT is atomic on the server).
async fn until_stopped<T>(
    f: impl std::future::Future<Output = T>,
    stop: &Stop,
    agent: &str,
) -> Result<T> {
    let f = std::pin::pin!(f);
    let stopped = std::pin::pin!(stop.wait());
    match futures::future::select(f, stopped).await {
        futures::future::Either::Left((v, _)) => Ok(v),
        futures::future::Either::Right(((), _)) => Err(canceled(agent)),
    }
}

fn canceled(agent: &str) -> Error {
    Error::Canceled {
        agent: agent.to_owned(),
        op: Op::PostXfer,
    }
}

async fn run_task(
    t: &Task,
    plan: &Plan,
    store: &AmazonS3,
    endpoint: &str,
    stop: &Stop,
) -> Result<()> {
    let agent = plan.agent.as_str();
    let map = |e| map_error(agent, endpoint, Op::PostXfer, e);
    // Queued work of a stopped post never starts.
    if stop.is_set() {
        return Err(canceled(agent));
    }
    match t {
        Task::Get {
            path,
            off,
            len,
            dst,
        } => get(store, path, (*off, *len), *dst, stop, agent, map).await,
        Task::Put {
            path,
            pieces,
            total,
        } if *total <= plan.multipart_threshold => {
            // A whole-object PUT is atomic on the server: stopping it leaves nothing behind.
            until_stopped(
                store.put(path, PutPayload::from(gather(pieces, 0, *total))),
                stop,
                agent,
            )
            .await?
            .map_err(map)?;
            Ok(())
        }
        Task::Put {
            path,
            pieces,
            total,
        } => put_multipart(store, path, pieces, *total, plan, stop, map).await,
    }
}

/// A ranged GET into `dst`; an object that ends early is `InvalidParam`.
async fn get(
    store: &AmazonS3,
    path: &object_store::path::Path,
    (off, len): (u64, u64),
    dst: u64,
    stop: &Stop,
    agent: &str,
    map: impl Fn(object_store::Error) -> Error,
) -> Result<()> {
    let bytes = until_stopped(store.get_range(path, off..off + len), stop, agent)
        .await?
        .map_err(map)?;
    if bytes.len() as u64 != len {
        return Err(Error::invalid(
            agent,
            Op::PostXfer,
            format!(
                "object {path} ended after {} of {len} bytes at offset {off}",
                bytes.len()
            ),
        ));
    }
    // Crate invariant: `dst..dst+len` lies in a DRAM registration the request keeps alive; the
    // task is aborted and awaited before the request lets go of it, and this copy runs between
    // await points so it is never torn by an abort.
    crate::sys::io::copy_to(dst, &bytes);
    Ok(())
}

/// A multipart upload, completed when every part is up; failed or stopped, it is aborted so
/// no part stays behind on the server.
async fn put_multipart(
    store: &AmazonS3,
    path: &object_store::path::Path,
    pieces: &[(u64, u64)],
    total: u64,
    plan: &Plan,
    stop: &Stop,
    map: impl Fn(object_store::Error) -> Error,
) -> Result<()> {
    let agent = plan.agent.as_str();
    let mut up = store.put_multipart(path).await.map_err(&map)?;
    let r = {
        let parts = std::pin::pin!(upload_parts(up.as_mut(), pieces, total, plan));
        let stopped = std::pin::pin!(stop.wait());
        match futures::future::select(parts, stopped).await {
            futures::future::Either::Left((r, _)) => r.map_err(&map),
            futures::future::Either::Right(((), _)) => Err(canceled(agent)),
        }
    };
    match r {
        Ok(()) => {
            up.complete().await.map_err(map)?;
            Ok(())
        }
        Err(e) => {
            if let Err(abort) = up.abort().await {
                tracing::warn!(agent, error = %abort, "OBJ: aborting a multipart upload failed");
            }
            Err(e)
        }
    }
}

async fn upload_parts(
    up: &mut dyn MultipartUpload,
    pieces: &[(u64, u64)],
    total: u64,
    plan: &Plan,
) -> object_store::Result<()> {
    let mut inflight = FuturesUnordered::new();
    let mut off = 0;
    while off < total {
        let len = (total - off).min(plan.part_size);
        inflight.push(up.put_part(PutPayload::from(gather(pieces, off, len))));
        off += len;
        if inflight.len() >= plan.max_concurrency {
            if let Some(r) = inflight.next().await {
                r?;
            }
        }
    }
    while let Some(r) = inflight.next().await {
        r?;
    }
    Ok(())
}

async fn run(
    plan: Arc<Plan>,
    store: Arc<AmazonS3>,
    endpoint: Arc<str>,
    stop: Arc<Stop>,
) -> Result<()> {
    futures::stream::iter(plan.tasks.iter().map(Ok))
        .try_for_each_concurrent(plan.max_concurrency, |t| {
            run_task(t, &plan, &store, &endpoint, &stop)
        })
        .await
}

/// A prepared OBJ request.
pub(crate) struct S3Xfer {
    plan: Arc<Plan>,
    store: Arc<AmazonS3>,
    rt: Arc<Runtime>,
    endpoint: Arc<str>,
    cancel_timeout: Duration,
    task: Option<JoinHandle<Result<()>>>,
    /// The current post's stop signal.
    stop: Arc<Stop>,
    done: bool,
}

impl S3Xfer {
    pub(super) fn new(
        plan: Plan,
        store: Arc<AmazonS3>,
        rt: Arc<Runtime>,
        endpoint: String,
        cancel_timeout: Duration,
    ) -> Self {
        S3Xfer {
            plan: Arc::new(plan),
            store,
            rt,
            endpoint: endpoint.into(),
            cancel_timeout,
            task: None,
            stop: Arc::new(Stop::default()),
            done: false,
        }
    }
}

impl BackendXfer for S3Xfer {
    fn post(&mut self) -> Result<XferState> {
        if self.task.as_ref().is_some_and(|t| !t.is_finished()) {
            return Err(Error::RepostActive {
                agent: self.plan.agent.clone(),
                op: Op::PostXfer,
            });
        }
        let h = self.rt.handle().ok_or_else(|| {
            Error::not_allowed(&self.plan.agent, Op::PostXfer, "OBJ runtime is shut down")
        })?;
        self.done = false;
        self.stop = Arc::new(Stop::default());
        self.task = Some(h.spawn(run(
            self.plan.clone(),
            self.store.clone(),
            self.endpoint.clone(),
            self.stop.clone(),
        )));
        Ok(XferState::InProgress)
    }

    fn check(&mut self) -> Result<XferState> {
        if self.done {
            return Ok(XferState::Done);
        }
        let Some(t) = &mut self.task else {
            return Err(Error::not_allowed(
                &self.plan.agent,
                Op::CheckXfer,
                "not posted",
            ));
        };
        if !t.is_finished() {
            return Ok(XferState::InProgress);
        }
        let r = futures::FutureExt::now_or_never(t);
        self.task = None;
        match r {
            Some(Ok(Ok(()))) => {
                self.done = true;
                Ok(XferState::Done)
            }
            Some(Ok(Err(e))) => Err(e),
            Some(Err(join)) => Err(Error::backend(
                &self.plan.agent,
                super::OBJ,
                Op::CheckXfer,
                format!("transfer task ended: {join}"),
            )),
            None => Err(Error::backend(
                &self.plan.agent,
                super::OBJ,
                Op::CheckXfer,
                "finished task had no result",
            )),
        }
    }

    fn cancel(&mut self) -> Result<()> {
        let Some(t) = &self.task else { return Ok(()) };
        // The task stops its queued work and aborts a multipart upload in progress; it is
        // dropped outright only when that takes longer than the cancel timeout.
        self.stop.stop();
        let deadline = Instant::now() + self.cancel_timeout;
        while !t.is_finished() {
            if Instant::now() >= deadline {
                t.abort();
                return Err(Error::TimedOut {
                    agent: self.plan.agent.clone(),
                    op: Op::Cancel,
                    elapsed: self.cancel_timeout,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.task = None;
        Ok(())
    }

    fn abandon(&mut self) {
        // The deadline passed: stop queued work and abort an upload in progress; the agent
        // polls `check` until the task has ended.
        self.stop.stop();
    }

    fn path(&self) -> Option<String> {
        Some(format!(
            "S3 at {} ({} requests)",
            self.endpoint,
            self.plan.tasks.len()
        ))
    }
}

impl Drop for S3Xfer {
    fn drop(&mut self) {
        if self.task.as_ref().is_some_and(|t| !t.is_finished()) && self.cancel().is_err() {
            tracing::error!(agent = %self.plan.agent, "OBJ: transfer task did not stop");
        }
    }
}
