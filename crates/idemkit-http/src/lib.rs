//! The `Idempotency-Key` header for tower and axum, on idemkit's coordinator.
//!
//! [`IdempotencyLayer`] wraps an axum `Router` (or any `Service<Request<Body>>`). On the
//! configured methods (POST and PATCH by default) a request with an `Idempotency-Key` header
//! runs the handler at most once per (scope, key): the response (status, an allowlist of
//! headers, the body bytes as they are) is stored and replayed byte for byte to every retry,
//! marked with `Idempotent-Replayed: true`. A concurrent retry waits for the first response
//! (the default) or, in reject mode, gets `409` with `Retry-After`.
//!
//! - **The key**: the IETF draft's structured-field string (`Idempotency-Key: "8e03978e"`)
//!   or Stripe's bare token (`Idempotency-Key: 8e03978e`), both accepted; at most 255
//!   characters, printable ASCII. Missing on a route that requires it: `400`; malformed or
//!   over-long: `400`.
//! - **Scope**: keys are scoped to the caller, so one client's key never replays another's
//!   response. The builder requires either a scope function (from an auth extension, a
//!   tenant header...; a request it cannot scope is refused with `403`) or an explicit, named
//!   global scope.
//! - **Fingerprint**: method, path and query, a hash of the body and optionally chosen
//!   headers. A key reused for a different request is answered `422`, also while the first
//!   request still runs. `canonical_json(true)` fingerprints a JSON body by its value (key
//!   order and insignificant whitespace ignored). The body is read up to
//!   [`max_body_bytes`](Builder::max_body_bytes) (1 MiB by default); over it: `413`, nothing
//!   stored, the handler not called.
//! - **What is final**: a user rule, by default 2xx and 4xx except 408, 409, 425 and 429 are
//!   final (stored and replayed); anything else (5xx) releases the key, so the client's retry
//!   runs the handler again.
//! - **Failures**: the store down is `503` (fail closed; with
//!   [`on_store_error(OnStoreError::FailOpen)`](Builder::on_store_error), or that policy on
//!   the coordinator, the handler runs unprotected instead). A handler that panics stores
//!   nothing, and neither does a request whose client disconnected mid-way: the call is
//!   dropped with it and its key released at once. Every error is
//!   `application/problem+json` with a stable `type` (see [`Problem`]).
//!
//! The handler can read the key and the fingerprint with the [`IdempotencyInfo`] extractor.
//!
//! # Example
//!
//! ```
//! use axum::{Router, routing::post};
//! use idemkit_core::{Coordinator, MemoryStore, Operation, Scope};
//! use idemkit_http::IdempotencyLayer;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let idempotency = IdempotencyLayer::builder(
//!     Coordinator::new(MemoryStore::new()),
//!     Operation::new("http.payments")?,
//! )
//! // Scope by the caller: here a tenant header an auth layer in front has checked.
//! .scope_by(|req: &http::request::Parts| {
//!     let tenant = req.headers.get("x-tenant")?.to_str().ok()?;
//!     Scope::new(tenant).ok()
//! })
//! .build()?;
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "ch_1" }))
//!     .layer(idempotency);
//! # let _ = app;
//! # Ok(()) }
//! ```

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use idemkit_core::{
    Codec, Coordinator, Error, FencingToken, Fingerprint, InFlight, Key, KeyError, OnStoreError,
    Operation, Scope, Store,
};
use tower_layer::Layer;
use tower_service::Service;

/// The request header: `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header that marks a replayed response: `Idempotent-Replayed: true`.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The longest key accepted, in characters (Stripe's limit).
pub const MAX_KEY_LEN: usize = 255;

type ScopeFn = Arc<dyn Fn(&http::request::Parts) -> Option<Scope> + Send + Sync>;

#[derive(Clone)]
enum ScopeRule {
    Global(Scope),
    By(ScopeFn),
}

struct Config<S> {
    coordinator: Coordinator<S>,
    operation: Operation,
    scope: ScopeRule,
    methods: Vec<Method>,
    required: bool,
    max_body: usize,
    headers: Vec<HeaderName>,
    canonical_json: bool,
    keep: Arc<Vec<HeaderName>>,
    is_final: fn(StatusCode) -> bool,
    in_flight: Option<InFlight>,
    ttl: Option<Duration>,
    on_store_error: Option<OnStoreError>,
}

/// The default rule for what is final (stored and replayed): 2xx, and 4xx other than 408,
/// 409, 425 and 429 (which a retry may change).
///
/// # Example
///
/// ```
/// use http::StatusCode;
/// assert!(idemkit_http::final_by_default(StatusCode::CREATED));
/// assert!(idemkit_http::final_by_default(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!idemkit_http::final_by_default(StatusCode::TOO_MANY_REQUESTS));
/// assert!(!idemkit_http::final_by_default(StatusCode::SERVICE_UNAVAILABLE));
/// ```
pub fn final_by_default(status: StatusCode) -> bool {
    status.is_success()
        || (status.is_client_error() && !matches!(status.as_u16(), 408 | 409 | 425 | 429))
}

/// Configures an [`IdempotencyLayer`]. A scope rule is required:
/// [`scope_by`](Builder::scope_by) or [`global_scope`](Builder::global_scope).
pub struct Builder<S> {
    coordinator: Coordinator<S>,
    operation: Operation,
    scope: Option<ScopeRule>,
    methods: Vec<Method>,
    required: bool,
    max_body: usize,
    headers: Vec<HeaderName>,
    canonical_json: bool,
    keep: Vec<HeaderName>,
    is_final: fn(StatusCode) -> bool,
    in_flight: Option<InFlight>,
    ttl: Option<Duration>,
    on_store_error: Option<OnStoreError>,
}

impl<S> fmt::Debug for Builder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("operation", &self.operation)
            .field("methods", &self.methods)
            .field("required", &self.required)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

/// Why a layer could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// Neither a scope function nor a global scope was chosen: keys would be shared between
    /// callers.
    NoScope,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoScope => f.write_str(
                "the idempotency layer needs a scope: scope_by(..) for per-caller keys, or global_scope(..) to share keys on purpose",
            ),
        }
    }
}

impl std::error::Error for BuildError {}

impl<S: Store> Builder<S> {
    /// Scopes each request's key by `f` (e.g. the authenticated user or tenant from an
    /// extension). A request for which `f` returns `None` is refused with `403`, never
    /// served under a shared scope.
    pub fn scope_by(
        mut self,
        f: impl Fn(&http::request::Parts) -> Option<Scope> + Send + Sync + 'static,
    ) -> Self {
        self.scope = Some(ScopeRule::By(Arc::new(f)));
        self
    }

    /// One scope for every request, named `name`: only for APIs whose keys are global on
    /// purpose (a single-tenant internal service).
    ///
    /// # Errors
    ///
    /// `name` is not a valid [`Scope`].
    pub fn global_scope(mut self, name: &str) -> Result<Self, KeyError> {
        self.scope = Some(ScopeRule::Global(Scope::new(name)?));
        Ok(self)
    }

    /// The methods the layer handles (POST and PATCH by default); others pass through.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Whether a request without the header is refused with `400` (false by default: it
    /// passes through unprotected). Apply the layer per route for per-route rules.
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// The largest request body read for the fingerprint (1 MiB by default); over it the
    /// request is refused with `413` and nothing is stored.
    pub fn max_body_bytes(mut self, max: usize) -> Self {
        self.max_body = max;
        self
    }

    /// Request headers that are part of the fingerprint (none by default).
    pub fn fingerprint_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.headers = names.into_iter().collect();
        self
    }

    /// Fingerprints a JSON body by its value: key order and insignificant whitespace do not
    /// count (off by default). A body that is not JSON is fingerprinted by its bytes.
    pub fn canonical_json(mut self, on: bool) -> Self {
        self.canonical_json = on;
        self
    }

    /// The response headers stored and replayed (by default `content-type`,
    /// `content-language`, `location`, `etag`, `last-modified` and `cache-control`).
    pub fn keep_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.keep = names.into_iter().collect();
        self
    }

    /// Which response statuses are final (stored and replayed); the others release the key.
    /// Default: [`final_by_default`].
    pub fn final_when(mut self, rule: fn(StatusCode) -> bool) -> Self {
        self.is_final = rule;
        self
    }

    /// A concurrent retry waits for the first response (`Wait`, the coordinator's default)
    /// or gets `409` with `Retry-After` (`Reject`).
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.in_flight = Some(in_flight);
        self
    }

    /// How long a response is kept (the policy's TTL otherwise): longer than clients retry.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// What a request does when the store is down, instead of the coordinator's policy:
    /// `FailClosed` answers `503` (the default policy), `FailOpen` runs the handler
    /// unprotected (counted and logged by the coordinator; nothing is stored).
    pub fn on_store_error(mut self, on_store_error: OnStoreError) -> Self {
        self.on_store_error = Some(on_store_error);
        self
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`BuildError::NoScope`] without a scope rule.
    pub fn build(self) -> Result<IdempotencyLayer<S>, BuildError> {
        let scope = self.scope.ok_or(BuildError::NoScope)?;
        Ok(IdempotencyLayer {
            config: Arc::new(Config {
                coordinator: self.coordinator,
                operation: self.operation,
                scope,
                methods: self.methods,
                required: self.required,
                max_body: self.max_body,
                headers: self.headers,
                canonical_json: self.canonical_json,
                keep: Arc::new(self.keep),
                is_final: self.is_final,
                in_flight: self.in_flight,
                ttl: self.ttl,
                on_store_error: self.on_store_error,
            }),
        })
    }
}

/// The layer. See the [crate docs](crate).
pub struct IdempotencyLayer<S> {
    config: Arc<Config<S>>,
}

impl<S> Clone for IdempotencyLayer<S> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            config: self.config.clone(),
        }
    }
}

impl<S> fmt::Debug for IdempotencyLayer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("operation", &self.config.operation)
            .field("methods", &self.config.methods)
            .finish_non_exhaustive()
    }
}

impl<S: Store> IdempotencyLayer<S> {
    /// A builder for `operation` (the name the layer's records are stored under).
    pub fn builder(coordinator: Coordinator<S>, operation: Operation) -> Builder<S> {
        Builder {
            coordinator,
            operation,
            scope: None,
            methods: vec![Method::POST, Method::PATCH],
            required: false,
            max_body: 1 << 20,
            headers: Vec::new(),
            canonical_json: false,
            keep: [
                http::header::CONTENT_TYPE,
                http::header::CONTENT_LANGUAGE,
                http::header::LOCATION,
                http::header::ETAG,
                http::header::LAST_MODIFIED,
                http::header::CACHE_CONTROL,
            ]
            .into(),
            is_final: final_by_default,
            in_flight: None,
            ttl: None,
            on_store_error: None,
        }
    }
}

impl<S, Svc> Layer<Svc> for IdempotencyLayer<S> {
    type Service = Idempotent<S, Svc>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Idempotent {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] makes.
pub struct Idempotent<S, Svc> {
    inner: Svc,
    config: Arc<Config<S>>,
}

impl<S, Svc: Clone> Clone for Idempotent<S, Svc> {
    fn clone(&self) -> Self {
        Idempotent {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S, Svc: fmt::Debug> fmt::Debug for Idempotent<S, Svc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotent")
            .field("inner", &self.inner)
            .field("operation", &self.config.operation)
            .finish_non_exhaustive()
    }
}

/// What the handler can read about its request's idempotency (an axum extractor, and a
/// request extension for any tower service).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdempotencyInfo {
    /// The request's key, as parsed from the header.
    pub key: Key,
    /// The scope it is stored under.
    pub scope: Scope,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The fencing token of this run's reservation: `None` when the handler runs
    /// unprotected (the store down and the layer failing open). A handler runs only for the
    /// first request of a key to complete (replays never reach it; a request whose response
    /// was not final released the key, and its retry runs with a higher token): pass the
    /// token to a downstream system that orders writers.
    pub fencing: Option<FencingToken>,
}

impl<St: Send + Sync> axum::extract::FromRequestParts<St> for IdempotencyInfo {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &St,
    ) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<IdempotencyInfo>().cloned().ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "no Idempotency-Key on this request (or the idempotency layer is not applied)",
        ))
    }
}

/// The problems the layer answers with, as `application/problem+json` (RFC 9457): each has
/// a stable `type`, `urn:idemkit:problem:<name>`.
///
/// | problem | status | when |
/// |---|---|---|
/// | `missing-key` | 400 | the route requires the header and it is absent |
/// | `malformed-key` | 400 | the header is not a string or token, is empty, repeated, or over 255 characters |
/// | `unscoped-request` | 403 | the scope function could not scope the request |
/// | `body-too-large` | 413 | the body is over `max_body_bytes` |
/// | `unreadable-body` | 400 | the body could not be read |
/// | `in-progress` | 409 | reject mode: the first request with this key still runs (`Retry-After`) |
/// | `key-reused` | 422 | the key was used for a different request |
/// | `store-unavailable` | 503 | the store is down (fail closed) |
/// | `internal` | 500 | a stored record that cannot be read, or a response that could not be stored |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// 400: the header is required and absent.
    MissingKey,
    /// 400: the header is malformed.
    MalformedKey,
    /// 403: the request could not be scoped.
    UnscopedRequest,
    /// 413: the body is too large.
    BodyTooLarge,
    /// 400: the body could not be read.
    UnreadableBody,
    /// 409: in progress (reject mode).
    InProgress,
    /// 422: the key was used for another request.
    KeyReused,
    /// 503: the store is down.
    StoreUnavailable,
    /// 500: anything else.
    Internal,
}

impl Problem {
    /// The problem's name, the last part of its `type`.
    pub fn name(self) -> &'static str {
        match self {
            Problem::MissingKey => "missing-key",
            Problem::MalformedKey => "malformed-key",
            Problem::UnscopedRequest => "unscoped-request",
            Problem::BodyTooLarge => "body-too-large",
            Problem::UnreadableBody => "unreadable-body",
            Problem::InProgress => "in-progress",
            Problem::KeyReused => "key-reused",
            Problem::StoreUnavailable => "store-unavailable",
            Problem::Internal => "internal",
        }
    }

    /// Its status.
    pub fn status(self) -> StatusCode {
        match self {
            Problem::MissingKey | Problem::MalformedKey | Problem::UnreadableBody => {
                StatusCode::BAD_REQUEST
            }
            Problem::UnscopedRequest => StatusCode::FORBIDDEN,
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::InProgress => StatusCode::CONFLICT,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The response: `application/problem+json` with `type`, `title`, `status`, `detail`.
    pub fn response(self, detail: &str) -> Response<Body> {
        let body = serde_json::json!({
            "type": format!("urn:idemkit:problem:{}", self.name()),
            "title": self.status().canonical_reason().unwrap_or("error"),
            "status": self.status().as_u16(),
            "detail": detail,
        });
        let mut resp = Response::new(Body::from(body.to_string()));
        *resp.status_mut() = self.status();
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        resp
    }
}

/// Parses an `Idempotency-Key` header value: a structured-field string (`"abc"`, with `\"`
/// and `\\` escapes) or a bare token (printable ASCII without spaces, quotes or
/// backslashes); at most [`MAX_KEY_LEN`] characters, not empty.
///
/// # Errors
///
/// Why the value is not a key.
///
/// # Example
///
/// ```
/// use idemkit_http::parse_key;
/// assert_eq!(parse_key(b"\"8e03978e-40d5\"").unwrap(), "8e03978e-40d5");
/// assert_eq!(parse_key(b"8e03978e-40d5").unwrap(), "8e03978e-40d5");
/// assert_eq!(parse_key(b"\"a \\\"quoted\\\" key\"").unwrap(), "a \"quoted\" key");
/// assert!(parse_key(b"").is_err());
/// assert!(parse_key(b"two words").is_err());
/// ```
pub fn parse_key(value: &[u8]) -> Result<String, &'static str> {
    let value = value.trim_ascii();
    let text = if let Some(inner) = value.strip_prefix(b"\"") {
        let inner = inner
            .strip_suffix(b"\"")
            .ok_or("a quoted key must end with a quote")?;
        let mut out = String::with_capacity(inner.len());
        let mut bytes = inner.iter();
        while let Some(&b) = bytes.next() {
            match b {
                b'\\' => match bytes.next() {
                    Some(&c @ (b'"' | b'\\')) => out.push(c as char),
                    _ => return Err("a quoted key may escape only \" and \\"),
                },
                b'"' => return Err("a quoted key has an unescaped quote inside"),
                0x20..=0x7e => out.push(b as char),
                _ => return Err("a key must be printable ASCII"),
            }
        }
        out
    } else {
        if value
            .iter()
            .any(|b| !(0x21..=0x7e).contains(b) || *b == b'"' || *b == b'\\')
        {
            return Err(
                "an unquoted key must be printable ASCII without spaces, quotes or backslashes",
            );
        }
        String::from_utf8_lossy(value).into_owned()
    };
    if text.trim().is_empty() {
        return Err("the key is empty");
    }
    if text.chars().count() > MAX_KEY_LEN {
        return Err("the key is longer than 255 characters");
    }
    Ok(text)
}

/// A response as stored: status, the kept headers, the body bytes.
#[derive(Debug, Clone)]
struct Stored {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// A response that is not final: returned to the client, the key released.
struct NotFinal(Response<Body>);

/// Stored responses' own format (the body's bytes as they are, not JSON): `IDH1`, status
/// (2 bytes), header count (2), each header's name length (2), name, value length (4),
/// value; then the body. Only the kept headers are encoded.
#[derive(Clone)]
struct ResponseCodec {
    keep: Arc<Vec<HeaderName>>,
}

impl Codec<Stored> for ResponseCodec {
    fn encode(&self, r: &Stored) -> Result<Vec<u8>, idemkit_core::store::BoxError> {
        let kept: Vec<(&HeaderName, &HeaderValue)> = r
            .headers
            .iter()
            .filter(|(n, _)| self.keep.contains(n))
            .collect();
        let mut out = Vec::with_capacity(8 + r.body.len() + 64 * kept.len());
        out.extend_from_slice(b"IDH1");
        out.extend_from_slice(&r.status.as_u16().to_be_bytes());
        out.extend_from_slice(&u16::try_from(kept.len())?.to_be_bytes());
        for (name, value) in kept {
            out.extend_from_slice(&u16::try_from(name.as_str().len())?.to_be_bytes());
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(&u32::try_from(value.len())?.to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&r.body);
        Ok(out)
    }

    fn decode(&self, bytes: &[u8]) -> Result<Stored, idemkit_core::store::BoxError> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], &'static str> {
            if b.len() < n {
                return Err("a stored response cut short");
            }
            let (head, rest) = b.split_at(n);
            *b = rest;
            Ok(head)
        }
        let mut b = bytes;
        if take(&mut b, 4)? != b"IDH1" {
            return Err("not a stored HTTP response".into());
        }
        let u16_of = |s: &[u8]| u16::from_be_bytes([s[0], s[1]]);
        let status = StatusCode::from_u16(u16_of(take(&mut b, 2)?))?;
        let count = u16_of(take(&mut b, 2)?);
        let mut headers = HeaderMap::new();
        for _ in 0..count {
            let n = u16_of(take(&mut b, 2)?) as usize;
            let name = HeaderName::from_bytes(take(&mut b, n)?)?;
            let len = take(&mut b, 4)?;
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let value = HeaderValue::from_bytes(take(&mut b, len)?)?;
            headers.append(name, value);
        }
        Ok(Stored {
            status,
            headers,
            body: Bytes::copy_from_slice(b),
        })
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, Svc> Service<Request<Body>> for Idempotent<S, Svc>
where
    S: Store,
    Svc: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    Svc::Future: Send,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // The ready service serves this request; a clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(async move { Ok(handle(config, inner, req).await) })
    }
}

async fn handle<S, Svc>(
    config: Arc<Config<S>>,
    mut inner: Svc,
    req: Request<Body>,
) -> Response<Body>
where
    S: Store,
    Svc: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    Svc::Future: Send,
{
    if !config.methods.contains(req.method()) {
        return call_inner(&mut inner, req).await;
    }
    let (mut parts, body) = req.into_parts();
    let mut values = parts.headers.get_all(&IDEMPOTENCY_KEY).iter();
    let key = match (values.next(), values.next()) {
        (None, _) if config.required => {
            return Problem::MissingKey.response("this request requires an Idempotency-Key header");
        }
        (None, _) => return call_inner(&mut inner, Request::from_parts(parts, body)).await,
        (Some(_), Some(_)) => {
            return Problem::MalformedKey.response("more than one Idempotency-Key header");
        }
        (Some(v), None) => match parse_key(v.as_bytes()).map(Key::new) {
            Ok(Ok(key)) => key,
            Ok(Err(e)) => return Problem::MalformedKey.response(&e.to_string()),
            Err(e) => return Problem::MalformedKey.response(e),
        },
    };
    let scope = match &config.scope {
        ScopeRule::Global(s) => s.clone(),
        ScopeRule::By(f) => match f(&parts) {
            Some(s) => s,
            None => {
                return Problem::UnscopedRequest
                    .response("this request cannot be scoped to a caller, so its key is refused");
            }
        },
    };
    let bytes = match http_body_util::Limited::new(body, config.max_body)
        .collect()
        .await
    {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Problem::BodyTooLarge.response(&format!(
                "the body is over {} bytes: nothing was stored",
                config.max_body
            ));
        }
        Err(e) => return Problem::UnreadableBody.response(&e.to_string()),
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
        .call(&config.operation, &key)
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
    let result = call
        .codec(codec)
        .run(|attempt| async move {
            info.fencing = attempt.fencing_token();
            parts.extensions.insert(info);
            let resp = call_inner(&mut inner, Request::from_parts(parts, Body::from(bytes))).await;
            let (rparts, rbody) = resp.into_parts();
            match rbody.collect().await {
                Ok(c) if is_final(rparts.status) => Ok(Stored {
                    status: rparts.status,
                    headers: rparts.headers,
                    body: c.to_bytes(),
                }),
                Ok(c) => Err(NotFinal(Response::from_parts(
                    rparts,
                    Body::from(c.to_bytes()),
                ))),
                Err(e) => Err(NotFinal(
                    Problem::Internal.response(&format!("the handler's body failed: {e}")),
                )),
            }
        })
        .await;
    match result {
        Ok(receipt) => {
            let replayed = receipt.is_replay();
            let Stored {
                status,
                headers,
                body,
            } = receipt.value;
            let mut resp = Response::new(Body::from(body));
            *resp.status_mut() = status;
            *resp.headers_mut() = headers;
            if replayed {
                resp.headers_mut()
                    .insert(REPLAYED, HeaderValue::from_static("true"));
            }
            resp
        }
        Err(Error::Action(NotFinal(resp))) => resp,
        Err(e @ Error::InFlight { .. }) => {
            let after = e.retry_after().unwrap_or_default();
            // Whole seconds, rounded up: "Retry-After: 0" would invite an immediate retry.
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            let mut resp = Problem::InProgress
                .response("a request with this key is still being processed; retry later");
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            resp
        }
        Err(Error::KeyReused) => {
            Problem::KeyReused.response("this Idempotency-Key was used for a different request")
        }
        Err(Error::Store { source, .. }) if source.is_unavailable() => {
            Problem::StoreUnavailable.response("the idempotency store is unavailable")
        }
        Err(e) => {
            tracing::warn!(error = %e, "idempotency layer: answering 500");
            Problem::Internal.response(&e.to_string())
        }
    }
}

async fn call_inner<Svc>(inner: &mut Svc, req: Request<Body>) -> Response<Body>
where
    Svc: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
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

/// Method, path and query, the chosen headers, and the body (its JSON value when
/// `canonical_json` is on and it parses).
fn fingerprint<S>(config: &Config<S>, parts: &http::request::Parts, body: &Bytes) -> Fingerprint {
    let canonical;
    let body: &[u8] = if config.canonical_json {
        match serde_json::from_slice::<serde_json::Value>(body) {
            // serde_json's maps are sorted by key and serialised without whitespace.
            Ok(v) => {
                canonical = v.to_string();
                canonical.as_bytes()
            }
            Err(_) => body,
        }
    } else {
        body
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let mut fields: Vec<&[u8]> = vec![parts.method.as_str().as_bytes(), path.as_bytes()];
    for name in &config.headers {
        fields.push(name.as_str().as_bytes());
        for v in parts.headers.get_all(name) {
            fields.push(v.as_bytes());
        }
    }
    fields.push(body);
    Fingerprint::of_parts(fields)
}
