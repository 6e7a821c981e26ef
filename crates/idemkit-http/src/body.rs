//! The body of the layer's responses: a stored or problem response's bytes, the handler's
//! own body passed through, or a reserved call's response streamed out of the task that runs
//! it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use crate::service::BoxError;

/// One piece of a streamed response, from the task that runs the call to the client's body.
pub(crate) enum Piece {
    Frame(Frame<Bytes>),
    /// The handler's body failed: the client's body fails too.
    Failed(BoxError),
    /// The body is whole and its result stored (or the call ran unprotected).
    End,
}

pin_project_lite::pin_project! {
    /// The body of a response from [`Idempotency`](crate::Idempotency).
    ///
    /// A replayed or problem response is its bytes; a response the layer does not handle (a
    /// method it does not cover, a request without a key) and a response that is not final
    /// are the handler's own body, passed through. The first response of a reserved call is
    /// its body as the handler gave it: whole, if the handler had it whole at once (sent with
    /// its head once stored); else streamed, each frame reaching the client as the handler
    /// produces it, while the layer keeps a copy up to what may be stored. The layer holds
    /// only a few frames at a time, so a slow client slows the handler's body rather than
    /// filling memory. The last frame
    /// of a body that announces its end, and the end of every body, come once the result is
    /// stored, so a client that has the whole response and retries gets the replay. A
    /// streamed body that the handler breaks off (an error, a panic) ends with an error,
    /// never as a shorter body that looks whole.
    ///
    /// Its data is [`Bytes`] and its error a boxed error: what axum's `IntoResponse` and
    /// hyper take.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Full { data: Option<Bytes> },
        Inner { #[pin] body: B },
        Streamed {
            // Frames the handler had ready when the head was handed over.
            ready: VecDeque<Frame<Bytes>>,
            // The rest, from the call's task; `None`: `ready` is the whole body.
            pieces: Option<mpsc::Receiver<Piece>>,
            // What is left of an exact size the handler's body announced.
            left: Option<u64>,
            ended: bool,
            // With `cancel_with_client(true)`: the call ends with its client's body.
            cancel: Option<AbortOnDrop>,
        },
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Full { .. } => "Full",
            Kind::Inner { .. } => "Inner",
            Kind::Streamed { .. } => "Streamed",
        };
        f.debug_tuple("ResponseBody").field(&kind).finish()
    }
}

/// Aborts the task that runs a call when the client's body is dropped.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<B> ResponseBody<B> {
    /// The handler's own body, passed through.
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// A call's response: the frames the handler had ready, then the rest streamed from
    /// the task that runs the call.
    pub(crate) fn streamed(
        ready: Vec<Frame<Bytes>>,
        pieces: mpsc::Receiver<Piece>,
        exact: Option<u64>,
    ) -> Self {
        Self {
            kind: Kind::Streamed {
                ready: ready.into(),
                pieces: Some(pieces),
                left: exact,
                ended: false,
                cancel: None,
            },
        }
    }

    /// A whole body, in the frames the handler gave (one data frame, most often: no copy).
    pub(crate) fn whole(mut frames: Vec<Frame<Bytes>>) -> Self {
        if frames.len() <= 1 && frames.first().is_none_or(Frame::is_data) {
            let data = frames.pop().and_then(|f| f.into_data().ok());
            return Self::from(data.unwrap_or_default());
        }
        let size = frames
            .iter()
            .filter_map(Frame::data_ref)
            .map(|d| d.len() as u64)
            .sum();
        Self {
            kind: Kind::Streamed {
                ready: frames.into(),
                pieces: None,
                left: Some(size),
                ended: false,
                cancel: None,
            },
        }
    }

    /// Ties the call to this body: dropping the body aborts it.
    pub(crate) fn cancel_on_drop(&mut self, task: AbortOnDrop) {
        if let Kind::Streamed { cancel, .. } = &mut self.kind {
            *cancel = Some(task);
        }
    }
}

impl<B> From<Bytes> for ResponseBody<B> {
    fn from(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!bytes.is_empty()).then_some(bytes),
            },
        }
    }
}

impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::from(Bytes::new())
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Inner { body } => body.poll_frame(cx).map(|f| {
                f.map(|f| {
                    f.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
                        .map_err(Into::into)
                })
            }),
            KindProj::Streamed {
                ready,
                pieces,
                left,
                ended,
                ..
            } => {
                if *ended {
                    return Poll::Ready(None);
                }
                let piece = if let Some(frame) = ready.pop_front() {
                    Some(Piece::Frame(frame))
                } else if let Some(pieces) = pieces {
                    std::task::ready!(pieces.poll_recv(cx))
                } else {
                    Some(Piece::End)
                };
                Poll::Ready(match piece {
                    Some(Piece::Frame(frame)) => {
                        if let (Some(left), Some(data)) = (left.as_mut(), frame.data_ref()) {
                            *left = left.saturating_sub(data.len() as u64);
                        }
                        Some(Ok(frame))
                    }
                    Some(Piece::Failed(e)) => {
                        *ended = true;
                        Some(Err(e))
                    }
                    Some(Piece::End) => {
                        *ended = true;
                        None
                    }
                    // The task stopped without an end: it panicked or was aborted.
                    None => {
                        *ended = true;
                        Some(Err("the handler stopped before its response ended".into()))
                    }
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data } => data.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Streamed {
                ended,
                ready,
                pieces,
                ..
            } => *ended || (ready.is_empty() && pieces.is_none()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { body } => body.size_hint(),
            Kind::Streamed { left: Some(n), .. } => SizeHint::with_exact(*n),
            Kind::Streamed { .. } => SizeHint::default(),
        }
    }
}
