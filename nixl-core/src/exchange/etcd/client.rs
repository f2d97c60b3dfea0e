//! A small etcd v3 client: the unary and streaming calls the exchange makes, over a tonic
//! channel balanced across the configured endpoints, with the messages of [`super::pb`].
//!
//! Only what the exchange needs: range, put, delete, transactions, leases (grant, revoke,
//! keep-alive stream) and watches. Plain `http://` endpoints (etcd's default); a TLS or
//! authenticated etcd is reached through a local proxy (see docs/security.md).

use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::client::Grpc;
use tonic::codec::Streaming;
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

use super::pb;

/// Largest response accepted: a page of range results holds up to 256 metadata values.
const MAX_DECODE: usize = 64 << 20;
/// Requests queued on a streaming call before the sender waits.
const STREAM_QUEUE: usize = 16;

/// An etcd client error: the endpoint, the transport, or the server's gRPC status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EtcdError {
    /// An endpoint that is not an `http://host:port` URL.
    #[error("bad etcd endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// The server (or the transport, as `Unavailable`) answered with a gRPC status.
    #[error("etcd: {}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// A stream ended or refused a request.
    #[error("etcd {0} stream closed")]
    StreamClosed(&'static str),
}

// gRPC status codes that may go away on their own (a restart, an election, a dropped
// connection): worth retrying.
fn transient_code(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unknown
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Aborted
            | tonic::Code::Unavailable
    )
}

impl EtcdError {
    /// Whether the request is worth retrying.
    pub(super) fn is_transient(&self) -> bool {
        match self {
            EtcdError::Endpoint { .. } => false,
            EtcdError::Status(s) => transient_code(s.code()),
            EtcdError::StreamClosed(_) => true,
        }
    }

    /// Whether it says a lease no longer exists on the server.
    pub(super) fn is_lease_gone(&self) -> bool {
        match self {
            EtcdError::Status(s) => {
                s.code() == tonic::Code::NotFound || s.message().contains("lease not found")
            }
            _ => false,
        }
    }
}

/// One connection pool to an etcd cluster; cheap to clone (clones share connections).
#[derive(Clone)]
pub(crate) struct Client {
    grpc: Grpc<Channel>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

/// How connections are made and watched.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectOptions {
    /// Bound on each TCP connect.
    pub connect_timeout: Duration,
    /// HTTP/2 ping interval: a server that stopped answering under a long-lived watch is
    /// found by the pings going unanswered.
    pub keep_alive_interval: Duration,
    /// How long a ping may go unanswered.
    pub keep_alive_timeout: Duration,
}

/// Parses one endpoint: `http://host:port`, or `host:port` (http is implied).
fn endpoint(url: &str, opts: &ConnectOptions) -> Result<Endpoint, EtcdError> {
    let bad = |reason: String| EtcdError::Endpoint {
        endpoint: url.to_owned(),
        reason,
    };
    let full = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    if !full.starts_with("http://") {
        return Err(bad(
            "only http:// endpoints are supported (put a TLS proxy in front of a TLS etcd)"
                .to_owned(),
        ));
    }
    let ep = Endpoint::from_shared(full).map_err(|e| bad(e.to_string()))?;
    Ok(ep
        .connect_timeout(opts.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(opts.keep_alive_interval)
        .keep_alive_timeout(opts.keep_alive_timeout)
        .keep_alive_while_idle(true))
}

impl Client {
    /// Creates a client over `endpoints`. Connections are made lazily: a dead endpoint shows
    /// up as `Unavailable` statuses of the first requests. Must run inside a tokio runtime.
    pub(super) fn connect(endpoints: &[String], opts: ConnectOptions) -> Result<Self, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::Endpoint {
                endpoint: String::new(),
                reason: "no endpoints".to_owned(),
            });
        }
        let eps = endpoints
            .iter()
            .map(|e| endpoint(e, &opts))
            .collect::<Result<Vec<_>, _>>()?;
        let channel = Channel::balance_list(eps.into_iter());
        Ok(Client {
            grpc: Grpc::new(channel).max_decoding_message_size(MAX_DECODE),
        })
    }

    async fn ready(&self) -> Result<Grpc<Channel>, EtcdError> {
        let mut g = self.grpc.clone();
        g.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("etcd connection: {e}")))?;
        Ok(g)
    }

    async fn unary<Req, Resp>(&self, path: &'static str, req: Req) -> Result<Resp, EtcdError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut g = self.ready().await?;
        let codec = ProstCodec::<Req, Resp>::default();
        let resp = g
            .unary(
                tonic::Request::new(req),
                PathAndQuery::from_static(path),
                codec,
            )
            .await?;
        Ok(resp.into_inner())
    }

    /// Opens a bidirectional stream whose first request is `first`.
    async fn stream<Req, Resp>(
        &self,
        path: &'static str,
        first: Req,
        what: &'static str,
    ) -> Result<(mpsc::Sender<Req>, Streaming<Resp>), EtcdError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut g = self.ready().await?;
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        tx.send(first)
            .await
            .map_err(|_| EtcdError::StreamClosed(what))?;
        let codec = ProstCodec::<Req, Resp>::default();
        let resp = g
            .streaming(
                tonic::Request::new(ReceiverStream::new(rx)),
                PathAndQuery::from_static(path),
                codec,
            )
            .await?;
        Ok((tx, resp.into_inner()))
    }

    /// `KV.Range`.
    pub(super) async fn range(
        &self,
        req: pb::RangeRequest,
    ) -> Result<pb::RangeResponse, EtcdError> {
        self.unary("/etcdserverpb.KV/Range", req).await
    }

    /// `KV.Put`.
    pub(super) async fn put(&self, req: pb::PutRequest) -> Result<pb::PutResponse, EtcdError> {
        self.unary("/etcdserverpb.KV/Put", req).await
    }

    /// `KV.DeleteRange`.
    pub(super) async fn delete_range(
        &self,
        req: pb::DeleteRangeRequest,
    ) -> Result<pb::DeleteRangeResponse, EtcdError> {
        self.unary("/etcdserverpb.KV/DeleteRange", req).await
    }

    /// `KV.Txn`.
    pub(super) async fn txn(&self, req: pb::TxnRequest) -> Result<pb::TxnResponse, EtcdError> {
        self.unary("/etcdserverpb.KV/Txn", req).await
    }

    /// `Lease.LeaseGrant` of `ttl` seconds (the server picks the id).
    pub(super) async fn lease_grant(&self, ttl: i64) -> Result<pb::LeaseGrantResponse, EtcdError> {
        let r: pb::LeaseGrantResponse = self
            .unary(
                "/etcdserverpb.Lease/LeaseGrant",
                pb::LeaseGrantRequest { ttl, id: 0 },
            )
            .await?;
        if !r.error.is_empty() {
            return Err(tonic::Status::failed_precondition(r.error).into());
        }
        Ok(r)
    }

    /// `Lease.LeaseRevoke`.
    pub(super) async fn lease_revoke(&self, id: i64) -> Result<pb::LeaseRevokeResponse, EtcdError> {
        self.unary(
            "/etcdserverpb.Lease/LeaseRevoke",
            pb::LeaseRevokeRequest { id },
        )
        .await
    }

    /// `Lease.LeaseKeepAlive` for lease `id`: the first keep-alive is sent and its answer
    /// read (a TTL of 0 means the lease is gone: a `NotFound` status). Send more with
    /// [`KeepAlive::keep_alive`].
    pub(super) async fn lease_keep_alive(&self, id: i64) -> Result<KeepAlive, EtcdError> {
        let (tx, mut stream) = self
            .stream::<_, pb::LeaseKeepAliveResponse>(
                "/etcdserverpb.Lease/LeaseKeepAlive",
                pb::LeaseKeepAliveRequest { id },
                "keep-alive",
            )
            .await?;
        match stream.message().await? {
            Some(r) if r.ttl > 0 => Ok(KeepAlive { id, tx, stream }),
            Some(_) => Err(tonic::Status::not_found("etcd: lease not found").into()),
            None => Err(EtcdError::StreamClosed("keep-alive")),
        }
    }

    /// `Watch.Watch` with one create request. The watch lives as long as the returned
    /// [`Watch`].
    pub(super) async fn watch(&self, create: pb::WatchCreateRequest) -> Result<Watch, EtcdError> {
        let req = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
        };
        let (tx, stream) = self
            .stream("/etcdserverpb.Watch/Watch", req, "watch")
            .await?;
        Ok(Watch { _tx: tx, stream })
    }
}

/// An open keep-alive stream for one lease.
pub(crate) struct KeepAlive {
    id: i64,
    tx: mpsc::Sender<pb::LeaseKeepAliveRequest>,
    stream: Streaming<pb::LeaseKeepAliveResponse>,
}

impl KeepAlive {
    /// Sends one keep-alive and returns the TTL the server answered (0: the lease expired).
    pub(super) async fn keep_alive(&mut self) -> Result<i64, EtcdError> {
        self.tx
            .send(pb::LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| EtcdError::StreamClosed("keep-alive"))?;
        match self.stream.message().await? {
            Some(r) => Ok(r.ttl),
            None => Err(EtcdError::StreamClosed("keep-alive")),
        }
    }
}

/// An open watch: its responses, in order.
pub(crate) struct Watch {
    /// Keeps the request side open (dropping it ends the watch).
    _tx: mpsc::Sender<pb::WatchRequest>,
    stream: Streaming<pb::WatchResponse>,
}

impl Watch {
    /// The next response; `None` when the server ended the stream.
    pub(super) async fn message(&mut self) -> Result<Option<pb::WatchResponse>, EtcdError> {
        Ok(self.stream.message().await?)
    }
}

/// The end of a prefix range: `prefix` with its last byte incremented (etcd's
/// `clientv3.GetPrefixRangeEnd`); `\0` (every key) when no byte can be incremented.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn endpoints_are_checked() {
        let o = ConnectOptions {
            connect_timeout: Duration::from_secs(1),
            keep_alive_interval: Duration::from_secs(2),
            keep_alive_timeout: Duration::from_secs(1),
        };
        assert!(endpoint("http://127.0.0.1:2379", &o).is_ok());
        assert!(endpoint("127.0.0.1:2379", &o).is_ok());
        assert!(matches!(
            endpoint("https://127.0.0.1:2379", &o),
            Err(EtcdError::Endpoint { .. })
        ));
        assert!(matches!(
            endpoint("http://[::1", &o),
            Err(EtcdError::Endpoint { .. })
        ));
    }

    #[test]
    fn transient_statuses() {
        assert!(EtcdError::Status(tonic::Status::unavailable("x")).is_transient());
        assert!(!EtcdError::Status(tonic::Status::invalid_argument("x")).is_transient());
        assert!(EtcdError::Status(tonic::Status::not_found(
            "etcdserver: requested lease not found"
        ))
        .is_lease_gone());
    }
}
