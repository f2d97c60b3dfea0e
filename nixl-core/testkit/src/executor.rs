//! A minimal executor for the async tests: runs a future on the calling thread, parking until
//! its waker is called, and counts the polls (a future woken by completions is polled a few
//! times; one re-checked on a timer, many).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `f` to completion on this thread; returns its output and how many times it was
/// polled. A spurious unpark only adds a poll.
pub fn block_on<F: Future>(f: F) -> (F::Output, usize) {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let mut polls = 0;
    loop {
        polls += 1;
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return (v, polls);
        }
        std::thread::park_timeout(Duration::from_secs(30));
    }
}

/// The next item of a stream, as a future (no `StreamExt` needed).
pub fn next<S: futures_core::Stream + Unpin>(
    s: &mut S,
) -> impl Future<Output = Option<S::Item>> + '_ {
    std::future::poll_fn(move |cx| Pin::new(&mut *s).poll_next(cx))
}
