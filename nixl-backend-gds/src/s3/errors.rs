//! The one conversion from `object_store` errors into typed nixl errors.

use nixl_core::{Error, Op};
use object_store::client::{HttpError, HttpErrorKind};

/// Maps an `object_store` error: a missing object is [`Error::NotFound`], refused credentials
/// [`Error::NotAllowed`], an endpoint that cannot be reached (or answers nothing in time)
/// [`Error::Unavailable`] / [`Error::TimedOut`], the rest [`Error::Backend`] with the source.
pub(crate) fn map_error(agent: &str, endpoint: &str, op: Op, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { path, .. } => {
            Error::not_found(agent, op, format!("object {path} at {endpoint}"))
        }
        object_store::Error::PermissionDenied { path, source }
        | object_store::Error::Unauthenticated { path, source } => Error::not_allowed(
            agent,
            op,
            format!(
                "S3 at {endpoint} refused the credentials for {path}: {}",
                first_line(&source.to_string())
            ),
        ),
        other => {
            let (status, kind) = inspect(&other);
            match (status, kind) {
                (Some(401 | 403), _) => Error::not_allowed(
                    agent,
                    op,
                    format!(
                        "S3 at {endpoint} refused the credentials: {}",
                        first_line(&other.to_string())
                    ),
                ),
                (None, Some(HttpErrorKind::Connect)) => Error::Unavailable {
                    what: format!("S3 endpoint {endpoint}"),
                    hint: format!(
                        "it could not be reached ({}); check the endpoint and that the server runs",
                        first_line(&other.to_string())
                    ),
                },
                (None, Some(HttpErrorKind::Timeout)) => Error::TimedOut {
                    agent: agent.to_owned(),
                    op,
                    elapsed: std::time::Duration::ZERO,
                },
                _ => Error::Backend {
                    agent: agent.to_owned(),
                    backend: super::OBJ.to_owned(),
                    op,
                    message: first_line(&other.to_string()),
                    source: Some(std::sync::Arc::new(other)),
                },
            }
        }
    }
}

fn first_line(s: &str) -> String {
    let l = s.lines().next().unwrap_or("");
    if l.len() > 300 {
        let mut end = 300;
        while !l.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &l[..end])
    } else {
        l.to_owned()
    }
}

/// The HTTP status and the transport failure kind found in the error's source chain
/// (`object_store` keeps its retry error private, so the status is read from its message:
/// "Server returned non-2xx status code: 403 Forbidden").
fn inspect(e: &(dyn std::error::Error + 'static)) -> (Option<u16>, Option<HttpErrorKind>) {
    let mut status = None;
    let mut kind = None;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<HttpError>() {
            kind = kind.or(Some(h.kind()));
        }
        if status.is_none() {
            let msg = err.to_string();
            if let Some(i) = msg.find("status code: ") {
                status = msg[i + 13..]
                    .split_whitespace()
                    .next()
                    .and_then(|c| c.trim_end_matches(':').parse().ok());
            }
        }
        cur = err.source();
    }
    (status, kind)
}
