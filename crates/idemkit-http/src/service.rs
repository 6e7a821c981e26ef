//! One request through the layer: parse, scope, read, fingerprint, call, answer.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes};
use http::header::HeaderValue;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt as _;
use idemkit_core::{Error, Fingerprint, Key, Store};
use tokio::sync::{mpsc, oneshot};
use tower_service::Service;

use crate::binding::{Capture, Step};
use crate::body::{AbortOnDrop, Piece, ResponseBody};
use crate::stored::{NotFinal, ResponseCodec, Stored};
use crate::{
    Config, Finality, IDEMPOTENCY_KEY, Idempotency, IdempotencyInfo, Problem, REPLAYED, ScopeRule,
    parse_key, parse_key_lenient,
};

/// A body's error, boxed.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The frames of a streamed response that may be on their way between the task that runs
/// its call and its client: with the stored copy (at most `max_result_bytes`), all the
/// layer holds of a response, however long the handler streams.
const FRAMES_IN_FLIGHT: usize = 8;

/// The future [`Idempotency`] returns (boxed: it holds the coordinator's call around the
/// inner service's future).
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<B> {
    inner: Pin<Box<dyn Future<Output = Response<ResponseBody<B>>> + Send>>,
}

impl<B> std::fmt::Debug for ResponseFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<B> Future for ResponseFuture<B> {
    type Output = Result<Response<ResponseBody<B>>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx).map(Ok)
    }
}

impl<Svc, S, ReqB, ResB> Service<Request<ReqB>> for Idempotency<Svc, S>
where
    S: Store,
    Svc: Service<Request<ReqB>, Response = Response<ResB>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    Svc::Future: Send,
    ReqB: http_body::Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = Infallible;
    type Future = ResponseFuture<ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The ready service serves this request; a clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        ResponseFuture {
            inner: Box::pin(handle(config, inner, req)),
        }
    }
}

async fn handle<S, Svc, ReqB, ResB>(
    config: Arc<Config<S>>,
    mut inner: Svc,
    req: Request<ReqB>,
) -> Response<ResponseBody<ResB>>
where
    S: Store,
    Svc: Service<Request<ReqB>, Response = Response<ResB>, Error = Infallible> + Send + 'static,
    Svc::Future: Send,
    ReqB: http_body::Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    if !config.methods.contains(req.method()) {
        return call_inner(&mut inner, req).await.map(ResponseBody::inner);
    }
    let (mut parts, body) = req.into_parts();
    let mut values = parts.headers.get_all(&IDEMPOTENCY_KEY).iter();
    let key = match (values.next(), values.next()) {
        (None, _) if config.required => {
            return config.problem(
                Problem::MissingKey,
                "this request requires an Idempotency-Key header",
            );
        }
        (None, _) => {
            return call_inner(&mut inner, Request::from_parts(parts, body))
                .await
                .map(ResponseBody::inner);
        }
        (Some(_), Some(_)) => {
            return config.problem(
                Problem::MalformedKey,
                "more than one Idempotency-Key header",
            );
        }
        (Some(v), None) => match if config.lenient {
            parse_key_lenient(v.as_bytes())
        } else {
            parse_key(v.as_bytes())
        }
        .map(Key::new)
        {
            Ok(Ok(key)) => key,
            Ok(Err(e)) => return config.problem(Problem::MalformedKey, &e.to_string()),
            Err(e) => return config.problem(Problem::MalformedKey, e),
        },
    };
    let scope = match &config.scope {
        ScopeRule::Global(s) => s.clone(),
        ScopeRule::By(f) => match f(&parts) {
            Some(s) => s,
            None => {
                return config.problem(
                    Problem::UnscopedRequest,
                    "this request cannot be scoped to a caller, so its key is refused",
                );
            }
        },
    };
    let bytes = match http_body_util::Limited::new(body, config.max_body)
        .collect()
        .await
    {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return config.problem(
                Problem::BodyTooLarge,
                &format!(
                    "the body is over {} bytes: nothing was stored",
                    config.max_body
                ),
            );
        }
        Err(e) => return config.problem(Problem::UnreadableBody, &e.to_string()),
    };
    let fingerprint = fingerprint(&config, &parts, &bytes);
    let mut info = IdempotencyInfo {
        key: key.clone(),
        scope: scope.clone(),
        fingerprint,
        fencing: None,
    };
    let mut call = config
        .coordinator
        .call_owned(config.operation.clone(), key)
        .scope_owned(scope)
        .fingerprint(fingerprint);
    if let Some(m) = config.in_flight {
        call = call.in_flight(m);
    }
    if let Some(on_store_error) = config.on_store_error {
        let policy = config
            .coordinator
            .policy_for(&config.operation)
            .on_store_error(on_store_error);
        call = call.policy(policy.in_flight(config.in_flight.unwrap_or(policy.in_flight)));
    }
    if let Some(ttl) = config.ttl {
        call = call.ttl(ttl);
    }
    let codec = ResponseCodec {
        keep: config.keep.clone(),
    };
    let is_final = config.is_final;
    // Whether the handler started (from then on the call is an owner's, and must run to its
    // end even if the client goes away) or its client left first: decided once, by whichever
    // comes first (review L3: a flag read by the drop while the action set it let a client
    // that left at that instant abort a handler that had just started).
    let started = Arc::new(Start::default());
    let starts = started.clone();
    let timing = config.clone();
    // What may be stored of the response's body; past it, the store keeps only its status
    // and size (`Stored::omitted`).
    let policy = config.coordinator.policy_for(&config.operation);
    let max_result_bytes = policy.max_result_bytes;
    // How long a frame may wait for its client to make room (review M3): storing the
    // response must go at the handler's pace, never the client's, or a client that stops
    // reading holds the key (and, past `max_hold`, gets its handler run twice).
    let pace = crate::binding::client_pace(policy.lease);
    // A final response's head goes to the client as soon as the handler gives it; its body
    // follows frame by frame (`ResponseBody::streamed`), its last frame and end once the
    // call has returned (`Tail`).
    let (head_tx, mut head_rx) = oneshot::channel::<Response<ResponseBody<ResB>>>();
    let tail: Arc<Mutex<Option<Tail<ResB>>>> = Arc::new(Mutex::new(None));
    let tail_in = tail.clone();
    let run = call.codec(codec).run(move |attempt| async move {
        if !starts.start() {
            // The client left first: its task is being aborted; the handler never runs.
            return Err(NotFinal(internal(
                &timing,
                "the client left before the handler started",
                &"cancelled",
            )));
        }
        let began = tokio::time::Instant::now();
        info.fencing = attempt.fencing_token();
        parts.extensions.insert(info);
        let resp = call_inner(&mut inner, Request::from_parts(parts, ReqB::from(bytes))).await;
        let (rparts, rbody) = resp.into_parts();
        // The handler's own word first (a `Finality` extension), then the rule.
        let stored = rparts
            .extensions
            .get::<Finality>()
            .map_or_else(|| is_final(rparts.status), |f| *f == Finality::Final);
        if !stored {
            // Not final: its client reads the body as the handler gives it, nothing kept.
            timing.recent.record(began.elapsed());
            return Err(NotFinal(Response::from_parts(
                rparts,
                ResponseBody::inner(rbody),
            )));
        }
        let status = rparts.status;
        let mut headers = HeaderMap::new();
        for name in timing.keep.iter() {
            for value in rparts.headers.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        // What is kept to store, and which frame waits for it: the decisions the ASGI
        // middleware takes too (`binding::Capture`).
        let mut kept = Capture::new(max_result_bytes, None);
        let mut rbody = std::pin::pin!(rbody);
        // First what the body has ready, up to what may be stored: most bodies are whole
        // at once (a JSON answer), and go out with their head once the result is stored, in
        // one write, as an unstreamed layer would answer.
        let mut ready = Vec::new();
        loop {
            // (Errors boxed at once: the body's own error type need not be `Send`.)
            let polled = std::future::poll_fn(|cx| {
                Poll::Ready(
                    rbody
                        .as_mut()
                        .poll_frame(cx)
                        .map(|f| f.map(|f| f.map_err(Into::<BoxError>::into))),
                )
            })
            .await;
            match polled {
                // Not ready: a stream. Its head goes out now (below).
                Poll::Pending => break,
                Poll::Ready(None) => {
                    timing.recent.record(began.elapsed());
                    let whole = Response::from_parts(rparts, ResponseBody::whole(ready));
                    *tail_in.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(Tail::Whole(head_tx, whole));
                    return Ok(to_store(kept, status, headers));
                }
                Poll::Ready(Some(Err(e))) => {
                    timing.recent.record(began.elapsed());
                    return Err(NotFinal(internal(&timing, "the handler's body failed", &e)));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let frame = frame.map_data(|mut d| d.copy_to_bytes(d.remaining()));
                    // Whole or not is the loop's to find (`Ready(None)`), not the step's.
                    let _ = kept.push(frame.data_ref(), false);
                    ready.push(frame);
                    if kept.is_over() {
                        // Too large to store: streamed through from here.
                        break;
                    }
                }
            }
        }
        // A stream, or a body too large to store: the head and what is ready go out now,
        // the rest frame by frame as the handler produces it.
        let (tx, rx) = mpsc::channel(FRAMES_IN_FLIGHT);
        let exact = rbody.size_hint().exact().map(|left| {
            left + ready
                .iter()
                .filter_map(Frame::data_ref)
                .map(|d| d.len() as u64)
                .sum::<u64>()
        });
        // Where the client will take the body as whole: its exact size, or a `Content-Length`
        // the handler set itself (hyper sends that many bytes and the client stops there).
        // The frame that reaches it is held back like the last one (review L2).
        let announced = exact.or_else(|| {
            rparts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        });
        kept.announce(announced);
        // The client may be gone already: the body is read and stored all the same.
        let _ = head_tx.send(Response::from_parts(
            rparts,
            ResponseBody::streamed(ready, rx, exact),
        ));
        let mut out = Some(tx);
        let mut held = None;
        loop {
            let next = rbody
                .frame()
                .await
                .map(|f| f.map_err(Into::<BoxError>::into));
            let Some(frame) = next else { break };
            let frame = match frame {
                Ok(frame) => frame.map_data(|mut d| d.copy_to_bytes(d.remaining())),
                Err(e) => {
                    timing.recent.record(began.elapsed());
                    let resp = internal(&timing, "the handler's body failed", &e);
                    if let Some(tx) = out {
                        let _ = tx.send(Piece::Failed(e)).await;
                    }
                    return Err(NotFinal(resp));
                }
            };
            if kept.push(frame.data_ref(), rbody.is_end_stream()) == Step::Hold {
                // The last frame: it goes out with the end, once the result is stored.
                held = Some(frame);
                break;
            }
            if let Some(tx) = &out
                && !paced(pace, tx, Piece::Frame(frame)).await
            {
                // Gone, or too slow: its stream is cut off (its body ends with an error),
                // and the rest is read and stored all the same.
                out = None;
            }
        }
        timing.recent.record(began.elapsed());
        *tail_in.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Tail::Streamed { out, held });
        Ok(to_store(kept, status, headers))
    });
    // Once reserved, the call runs to its end in a task of its own whatever the client does:
    // a client that timed out and disconnected retries, and that retry must wait for (or
    // replay) this run, not cancel its effect half-way and run it again (ARCHITECTURE row
    // 17). A call that has not started its handler (a waiter, a replay) ends with its client;
    // with `cancel_with_client`, every call does.
    // Boxed: the call's future is many kilobytes, and a task's future is copied whole as it
    // is spawned, finished and read; a box is copied once (docs/benchmarks.md, "A message's
    // task, copied whole").
    let mut task = tokio::spawn(Box::pin(async move {
        let result = run.await;
        let tail = tail.lock().unwrap_or_else(PoisonError::into_inner).take();
        match tail {
            // Stored: the whole response goes to its client (gone: dropped).
            Some(Tail::Whole(head_tx, whole)) if result.is_ok() => {
                let _ = head_tx.send(whole);
            }
            Some(Tail::Streamed {
                out: Some(tx),
                held,
            }) => {
                // A clean end only for a response that was stored (review L1): one the
                // store could not keep ends with an error, as the layer's invariant says,
                // so that its client retries instead of trusting a response a retry would
                // run again.
                let stored = matches!(&result,
                    Ok(r) if r.stored || r.source == idemkit_core::Source::Unprotected);
                if stored {
                    let sent = match held {
                        Some(frame) => paced(pace, &tx, Piece::Frame(frame)).await,
                        None => true,
                    };
                    if sent {
                        let _ = paced(pace, &tx, Piece::End).await;
                    }
                } else {
                    let _ = paced(
                        pace,
                        &tx,
                        Piece::Failed("the response could not be stored".into()),
                    )
                    .await;
                }
            }
            // Not stored (the store failed): the call's error answers, as for a
            // response not streamed.
            Some(Tail::Whole(..) | Tail::Streamed { out: None, .. }) | None => {}
        }
        result
    }));
    let mut detached = Detached {
        task: task.abort_handle(),
        started,
        with_client: config.cancel_with_client,
        armed: true,
    };
    let joined = tokio::select! {
        biased;
        Ok(mut head) = &mut head_rx => {
            detached.armed = false;
            if config.cancel_with_client {
                head.body_mut().cancel_on_drop(AbortOnDrop(task.abort_handle()));
            }
            return head;
        }
        joined = &mut task => joined,
    };
    let result = match joined {
        Ok(result) => result,
        Err(e) => return internal(&config, "the handler panicked", &e),
    };
    match result {
        Ok(receipt) => {
            // A run of this call's own streamed its response above: this is a replay.
            let replayed = receipt.is_replay();
            let stored = receipt.value;
            if let Some(size) = stored.omitted {
                let mut resp: Response<ResponseBody<ResB>> = Problem::ResultUnavailable.render_as(
                    stored.status,
                    &format!(
                        "this request was executed ({}), but its response ({size} bytes) was too large to keep, so it cannot be shown again",
                        stored.status
                    ),
                    None,
                    config.problem_docs.as_deref(),
                );
                resp.headers_mut()
                    .insert(REPLAYED, HeaderValue::from_static("true"));
                return resp;
            }
            let Stored {
                status,
                headers,
                body,
                ..
            } = stored;
            let mut resp = Response::new(ResponseBody::from(body));
            *resp.status_mut() = status;
            *resp.headers_mut() = headers;
            if replayed {
                resp.headers_mut()
                    .insert(REPLAYED, HeaderValue::from_static("true"));
            }
            resp
        }
        Err(Error::Action(NotFinal(resp))) => resp,
        Err(Error::InFlight {
            retry_after,
            lease_left,
            held_for,
            attempt,
            holder,
            ..
        }) => {
            // What is left of a typical run (the hint, or the route's recent median), else
            // the coordinator's answer (the time left on the lease); never past the lease.
            let typical = config.retry_hint.or_else(|| config.recent.median());
            let after = match (typical, held_for) {
                (Some(t), held) => t.saturating_sub(held.unwrap_or_default()).min(lease_left),
                (None, _) => retry_after,
            };
            // Whole seconds, rounded up: "Retry-After: 0" would invite an immediate retry.
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            let holder = holder.filter(|_| config.in_progress_holder);
            let (head, body) = crate::binding::in_progress_response(
                config.problem_docs.as_deref(),
                secs,
                attempt,
                lease_left,
                holder.as_deref(),
            )
            .into_parts();
            Response::from_parts(head, ResponseBody::from(body))
        }
        Err(Error::KeyReused) => config.problem(
            Problem::KeyReused,
            "this Idempotency-Key was used for a different request",
        ),
        Err(Error::Store { source, phase, .. }) if source.is_unavailable() => {
            // Nothing ran; the cause is the operator's (a client learns only that the store
            // is down) and the client may come back: how soon an outage ends is unknown, so
            // a short, fixed `Retry-After`, to which a client adds its own backoff.
            tracing::warn!(error = %source, ?phase, "answering 503: the idempotency store is unavailable");
            let mut resp = config.problem(
                Problem::StoreUnavailable,
                "the idempotency store is unavailable",
            );
            resp.headers_mut().insert(
                http::header::RETRY_AFTER,
                HeaderValue::from(STORE_UNAVAILABLE_RETRY_AFTER_SECS),
            );
            resp
        }
        Err(e) => internal(&config, "answering 500", &e),
    }
}

/// The `Retry-After` of a `503 store-unavailable`, in seconds.
pub(crate) const STORE_UNAVAILABLE_RETRY_AFTER_SECS: u64 = 1;

/// A `500 internal` problem: the error's text goes to the log only, under an incident id
/// that the answer carries (its `instance`), so an operator can find the one from the
/// other and a client learns nothing of the store or the handler (SQL, script errors).
/// Sends `piece` to the client's body, waiting at most `pace` for room; `false` when the
/// client is gone or did not make room in time (the caller then drops its stream).
async fn paced(pace: std::time::Duration, tx: &mpsc::Sender<Piece>, piece: Piece) -> bool {
    matches!(tokio::time::timeout(pace, tx.send(piece)).await, Ok(Ok(())))
}

fn internal<S, B: From<Bytes>>(
    config: &Config<S>,
    what: &str,
    error: &dyn std::fmt::Display,
) -> Response<B> {
    let incident = format!("{:032x}", idemkit_core::OwnerToken::random().as_u128());
    tracing::error!(incident = %incident, error = %error, "idempotency layer: {what}");
    Problem::Internal.render(
        "an internal error; the server's log has it under this incident id",
        Some(&incident),
        config.problem_docs.as_deref(),
    )
}

/// What goes to the client once the call has returned, so that a client that has the whole
/// response finds its result stored.
enum Tail<B> {
    /// A body that was whole at once: the response itself, to send as the head.
    Whole(
        oneshot::Sender<Response<ResponseBody<B>>>,
        Response<ResponseBody<B>>,
    ),
    /// A streamed body: its last frame, if held back, and its end. `out` is `None` once the
    /// client left.
    Streamed {
        out: Option<mpsc::Sender<Piece>>,
        held: Option<Frame<Bytes>>,
    },
}

/// The response to store, as `capture` kept it.
fn to_store(capture: Capture, status: StatusCode, headers: HeaderMap) -> Stored {
    let r = capture.into_response(status, headers);
    Stored {
        status: r.status,
        headers: r.headers,
        body: r.body,
        omitted: r.omitted,
    }
}

/// Dropped with the request's future (its client went away before a response): aborts the
/// detached call if its handler has not started, so a waiter or a replay does not outlive
/// its client; with `cancel_with_client`, whether or not it has started. Disarmed once the
/// response is handed over.
struct Detached {
    task: tokio::task::AbortHandle,
    started: Arc<Start>,
    with_client: bool,
    armed: bool,
}

impl Drop for Detached {
    fn drop(&mut self) {
        if self.armed && (self.with_client || self.started.cancel()) {
            self.task.abort();
        }
    }
}

/// Whether a call's handler started or its client left first: each side claims the one
/// transition from idle, so exactly one of them wins.
#[derive(Default)]
struct Start(AtomicU8);

impl Start {
    const IDLE: u8 = 0;
    const STARTED: u8 = 1;
    const CANCELLED: u8 = 2;

    /// The handler may start: `false` once the client left.
    fn start(&self) -> bool {
        self.0
            .compare_exchange(
                Self::IDLE,
                Self::STARTED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }

    /// The client left: `true` if the handler had not started (and now never will).
    fn cancel(&self) -> bool {
        self.0
            .compare_exchange(
                Self::IDLE,
                Self::CANCELLED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }
}

async fn call_inner<Svc, ReqB, ResB>(inner: &mut Svc, req: Request<ReqB>) -> Response<ResB>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>, Error = Infallible>,
{
    match std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
        Ok(()) => {}
        Err(never) => match never {},
    }
    match inner.call(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

/// Method, path and query, `Authorization`, the chosen headers, and the body
/// ([`crate::binding::request_fingerprint`], which the Python binding shares).
fn fingerprint<S>(config: &Config<S>, parts: &http::request::Parts, body: &Bytes) -> Fingerprint {
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    crate::binding::request_fingerprint(
        &parts.method,
        path,
        &parts.headers,
        body,
        &crate::binding::FingerprintRule {
            canonical_json: config.canonical_json,
            authorization: config.authorization,
            headers: &config.headers,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::Start;

    /// Review L3: the handler's start and its client's leaving exclude each other, from
    /// either side and from two threads at once.
    #[test]
    fn a_handler_starts_or_its_client_cancels_never_both() {
        let s = Start::default();
        assert!(s.start());
        assert!(!s.cancel(), "a started handler was cancelled");
        let s = Start::default();
        assert!(s.cancel());
        assert!(!s.start(), "a cancelled call started its handler");
        for _ in 0..1_000 {
            let s = std::sync::Arc::new(Start::default());
            let other = s.clone();
            let cancel = std::thread::spawn(move || other.cancel());
            let started = s.start();
            assert_ne!(started, cancel.join().unwrap(), "both or neither won");
        }
    }
}
