//! One request through the layer: parse, scope, read, fingerprint, call, answer.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Request, Response};
use http_body_util::BodyExt as _;
use idemkit_core::{Error, Fingerprint, Key, Store};
use tower_service::Service;

use crate::stored::{NotFinal, ResponseCodec, Stored};
use crate::{
    Config, Finality, IDEMPOTENCY_KEY, Idempotency, IdempotencyInfo, Problem, REPLAYED, ScopeRule,
    parse_key, parse_key_lenient,
};

/// A body's error, boxed.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future [`Idempotency`] returns (boxed: it holds the coordinator's call around the
/// inner service's future).
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<B> {
    inner: Pin<Box<dyn Future<Output = Response<B>> + Send>>,
}

impl<B> std::fmt::Debug for ResponseFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<B> Future for ResponseFuture<B> {
    type Output = Result<Response<B>, Infallible>;

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
    ResB: http_body::Body + From<Bytes> + Send + 'static,
    ResB::Data: Send,
    ResB::Error: std::fmt::Display,
{
    type Response = Response<ResB>;
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
) -> Response<ResB>
where
    S: Store,
    Svc: Service<Request<ReqB>, Response = Response<ResB>, Error = Infallible> + Send + 'static,
    Svc::Future: Send,
    ReqB: http_body::Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body + From<Bytes> + Send + 'static,
    ResB::Data: Send,
    ResB::Error: std::fmt::Display,
{
    if !config.methods.contains(req.method()) {
        return call_inner(&mut inner, req).await;
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
        (None, _) => return call_inner(&mut inner, Request::from_parts(parts, body)).await,
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
    // Set when the handler starts: from then on the call is an owner's, and must run to its
    // end even if the client goes away.
    let started = Arc::new(AtomicBool::new(false));
    let starts = started.clone();
    let timing = config.clone();
    // A response too large to store goes to its first client from here; the store keeps
    // only its status (`Stored::omitted`).
    let storable = config
        .coordinator
        .policy_for(&config.operation)
        .max_result_bytes;
    let whole: Arc<std::sync::Mutex<Option<Stored>>> = Arc::default();
    let aside = whole.clone();
    let run = call.codec(codec).run(move |attempt| async move {
        starts.store(true, Ordering::SeqCst);
        let began = tokio::time::Instant::now();
        info.fencing = attempt.fencing_token();
        parts.extensions.insert(info);
        let resp = call_inner(&mut inner, Request::from_parts(parts, ReqB::from(bytes))).await;
        let (rparts, rbody) = resp.into_parts();
        let collected = rbody.collect().await;
        timing.recent.record(began.elapsed());
        match collected {
            // The handler's own word first (a `Finality` extension), then the rule.
            Ok(c)
                if rparts
                    .extensions
                    .get::<Finality>()
                    .map_or_else(|| is_final(rparts.status), |f| *f == Finality::Final) =>
            {
                let stored = Stored {
                    status: rparts.status,
                    headers: rparts.headers,
                    body: c.to_bytes(),
                    omitted: None,
                };
                // The headers' share is small and bounded by the kept list: leave room for it.
                if stored.body.len() + 4096 <= storable {
                    return Ok(stored);
                }
                let marker = Stored {
                    status: stored.status,
                    headers: http::HeaderMap::new(),
                    body: Bytes::new(),
                    omitted: Some(stored.body.len() as u64),
                };
                *aside
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(stored);
                Ok(marker)
            }
            Ok(c) => Err(NotFinal(Response::from_parts(
                rparts,
                ResB::from(c.to_bytes()),
            ))),
            Err(e) => Err(NotFinal(internal(&timing, "the handler's body failed", &e))),
        }
    });
    let result = if config.cancel_with_client {
        run.await
    } else {
        // Once reserved, the call runs to its end whatever the client does: a client that
        // timed out and disconnected retries, and that retry must wait for (or replay) this
        // run, not cancel its effect half-way and run it again (ARCHITECTURE row 17). A
        // call that has not started its handler (a waiter, a replay) ends with its client.
        let task = tokio::spawn(run);
        let _waiting = AbortUnstarted {
            task: task.abort_handle(),
            started,
        };
        match task.await {
            Ok(result) => result,
            Err(e) => {
                return internal(&config, "the handler panicked", &e);
            }
        }
    };
    match result {
        Ok(receipt) => {
            let replayed = receipt.is_replay();
            let taken = whole
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            let stored = match taken {
                Some(whole) if !replayed => whole,
                _ => receipt.value,
            };
            if let Some(size) = stored.omitted {
                let mut resp: Response<ResB> = Problem::ResultUnavailable.render_as(
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
            let mut resp = Response::new(ResB::from(body));
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
            let mut resp = config.problem(
                Problem::InProgress,
                "a request with this key is still being processed; retry later",
            );
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            resp
        }
        Err(Error::KeyReused) => config.problem(
            Problem::KeyReused,
            "this Idempotency-Key was used for a different request",
        ),
        Err(Error::Store { source, .. }) if source.is_unavailable() => config.problem(
            Problem::StoreUnavailable,
            "the idempotency store is unavailable",
        ),
        Err(e) => internal(&config, "answering 500", &e),
    }
}

/// A `500 internal` problem: the error's text goes to the log only, under an incident id
/// that the answer carries (its `instance`), so an operator can find the one from the
/// other and a client learns nothing of the store or the handler (SQL, script errors).
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

/// Dropped with the request's future (its client went away): aborts the detached call if
/// its handler has not started, so a waiter or a replay does not outlive its client.
struct AbortUnstarted {
    task: tokio::task::AbortHandle,
    started: Arc<AtomicBool>,
}

impl Drop for AbortUnstarted {
    fn drop(&mut self) {
        if !self.started.load(Ordering::SeqCst) {
            self.task.abort();
        }
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

/// Whether a request's body is JSON by its `Content-Type` (`application/json`, or any
/// `+json` type); a body without one counts if it parses.
fn json_body(parts: &http::request::Parts) -> Option<bool> {
    let ct = parts
        .headers
        .get(http::header::CONTENT_TYPE)?
        .to_str()
        .ok()?;
    let essence = ct
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    Some(essence == "application/json" || essence.ends_with("+json"))
}

/// Method, path and query, `Authorization`, the chosen headers, and the body: a JSON body by
/// its value (its canonical spelling, `canonical.rs`) when `canonical_json` is on.
fn fingerprint<S>(config: &Config<S>, parts: &http::request::Parts, body: &Bytes) -> Fingerprint {
    let canonical;
    let json = config.canonical_json && json_body(parts) != Some(false);
    let body: &[u8] = match json.then(|| serde_json::from_slice::<serde_json::Value>(body)) {
        Some(Ok(v)) => {
            canonical = crate::canonical::canonical(&v);
            canonical.as_bytes()
        }
        _ => body,
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let mut fields: Vec<&[u8]> = vec![parts.method.as_str().as_bytes(), path.as_bytes()];
    // The credential: within a scope, another caller's request is another request. Its
    // hash only is stored (the fingerprint), never the header.
    if config.authorization {
        fields.push(b"authorization");
        for v in parts.headers.get_all(http::header::AUTHORIZATION) {
            fields.push(v.as_bytes());
        }
    }
    for name in &config.headers {
        fields.push(name.as_str().as_bytes());
        for v in parts.headers.get_all(name) {
            fields.push(v.as_bytes());
        }
    }
    fields.push(body);
    Fingerprint::of_parts(fields)
}
