//! The `Idempotency-Key` header for tower and axum, on idemkit's coordinator.
//!
//! [`IdempotencyLayer`] wraps an axum `Router`, or any tower `Service<Request<B>>` whose
//! request body is `http_body::Body + From<Bytes>` (axum's `Body`, http-body-util's
//! `Full<Bytes>`...) and whose response body is any `http_body::Body`: the service it makes
//! is [`Idempotency`], whose responses have a [`ResponseBody`]. On the
//! configured methods (POST and PATCH by default) a request with an `Idempotency-Key` header
//! runs the handler at most once per (scope, key): the response (status, an allowlist of
//! headers, the body bytes as they are) is stored and replayed byte for byte to every retry,
//! marked with `Idempotent-Replayed: true`. A concurrent retry waits for the first response
//! (the default) or, in reject mode, gets `409` with `Retry-After`.
//!
//! - **The key**: an RFC 8941 structured-field Item, as the IETF draft specifies: a string
//!   (`Idempotency-Key: "8e03978e"`) or a token (`Idempotency-Key: key-8e03978e`), its
//!   parameters (`;v=1`) ignored; at most 255 characters, printable ASCII. Stripe's bare keys
//!   that are not tokens (a UUID starting with a digit) need
//!   [`lenient_bare_keys(true)`](IdempotencyLayerBuilder::lenient_bare_keys). Missing on a
//!   route that requires it: `400`; malformed or over-long: `400`.
//! - **Scope**: keys are scoped to the caller, so one client's key never replays another's
//!   response. The builder requires either a scope function (from an auth extension, a
//!   tenant header...; a request it cannot scope is refused with `403`) or an explicit, named
//!   global scope.
//! - **Fingerprint**: method, path and query, the request's `Authorization` (so that within
//!   one scope another credential's request never gets the stored response; see
//!   [`fingerprint_authorization`](IdempotencyLayerBuilder::fingerprint_authorization) for
//!   when to turn it off), a hash of the body and optionally chosen headers. A key reused for
//!   a different request is answered `422`, also while the first request still runs. A JSON
//!   body counts by its value (member order, whitespace, escapes and number spelling
//!   ignored; [`canonical_json(false)`](IdempotencyLayerBuilder::canonical_json) for bytes). The body is read up to
//!   [`max_body_bytes`](IdempotencyLayerBuilder::max_body_bytes) (1 MiB by default); over it: `413`, nothing
//!   stored, the handler not called.
//! - **What is final**: a response is stored and replayed only when it reports what the
//!   request did: by default ([`final_by_default`]) 2xx and the 4xx that report an outcome
//!   (402, 404, 410, ...); the 4xx that refuse a request before it executes (400, 401, 403,
//!   409, 413, 415, 422, 429, ...), and 5xx, release the key, so the client's corrected or
//!   later retry runs the handler. A handler overrides the rule per response with a
//!   [`Finality`] response extension; [`final_when`](IdempotencyLayerBuilder::final_when)
//!   replaces the rule.
//! - **Failures**: the store down is `503` (fail closed; with
//!   [`on_store_error(OnStoreError::FailOpen)`](IdempotencyLayerBuilder::on_store_error), or that policy on
//!   the coordinator, the handler runs unprotected instead). A handler that panics stores
//!   nothing and releases its key (`500`). Every error is `application/problem+json` with a
//!   stable `type` (see [`Problem`]); a `500`'s cause (the store's or the handler's error
//!   text) is logged only, under an incident id the problem's `instance` carries.
//! - **Stored headers**: only those of
//!   [`keep_headers`](IdempotencyLayerBuilder::keep_headers); per-caller ones (`Set-Cookie`,
//!   `Authorization`, ...) are refused, so a replay never hands one caller's session to
//!   another.
//! - **Streamed responses**: a final response whose body is whole at once (most answers)
//!   goes to its client, head and body together, once stored. One whose body is not (a
//!   download, server-sent events) reaches its client as the handler produces it: its head
//!   and what is ready at once, then each frame, while the layer keeps a copy of at most
//!   `max_result_bytes` to store; it holds at most a few frames in flight, so a long body is
//!   never buffered whole. A body larger than may
//!   be stored goes to its first client whole and is stored as its status and size: a
//!   retry gets that status with the problem `result-unavailable` (done, not shown again).
//!   The body's end comes once the result is stored, so a client that read it all and
//!   retries gets the replay; a body that breaks off (an error, a panic) ends with an error
//!   for its client and releases the key.
//! - **Clients that give up**: once a request's key is reserved, its handler runs to its
//!   end in a task of its own, even if the client disconnects (it timed out, it was killed):
//!   the response is stored, and the client's retry waits for it or replays it, as Stripe
//!   does. The handler is never cancelled half-way through an effect and run again.
//!   [`cancel_with_client(true)`](IdempotencyLayerBuilder::cancel_with_client) drops the handler with the
//!   connection instead (its key then stays reserved until the lease ends, or is released
//!   at once under `OnCancel::Release`).
//!
//! The handler can read the key and the fingerprint from the [`IdempotencyInfo`] request
//! extension, an axum extractor with the `axum` feature (on by default).
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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{Method, StatusCode};
use idemkit_core::{
    Coordinator, FencingToken, Fingerprint, InFlight, Key, KeyError, OnStoreError, Operation,
    Scope, Store,
};
use tower_layer::Layer;

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
    /// The request's `Authorization` is part of the fingerprint.
    authorization: bool,
    /// Bare keys may start with any token character (Stripe's unquoted UUIDs).
    lenient: bool,
    /// The builder's typical run time, if given.
    retry_hint: Option<Duration>,
    /// The base URL of the API's documentation of the layer's problems.
    problem_docs: Option<String>,
    /// The route's recent handler run times (for `Retry-After` without a hint).
    recent: RecentRuns,
    keep: Arc<Vec<HeaderName>>,
    is_final: fn(StatusCode) -> bool,
    in_flight: Option<InFlight>,
    ttl: Option<Duration>,
    on_store_error: Option<OnStoreError>,
    cancel_with_client: bool,
    /// A `409 in-progress` names the original's holder.
    in_progress_holder: bool,
}

/// The default rule for what is final (stored and replayed): a response that reports what
/// the request did. 2xx, and the 4xx that report an outcome (402 Payment Required, 404 Not
/// Found, 410 Gone, ...); not the 4xx that refuse a request before it executes (400, 401,
/// 403, 405-409, 411-415, 417, 421-423, 425, 426, 428, 429, 431: validation,
/// authentication, preconditions, limits, conflicts), nor 5xx, nor 1xx and 3xx: those
/// release the key, so a corrected or later retry with it runs. A handler overrides the
/// rule per response with a [`Finality`] extension; docs/http.md has the table.
///
/// # Example
///
/// ```
/// use http::StatusCode;
/// assert!(idemkit_http::final_by_default(StatusCode::CREATED));
/// assert!(idemkit_http::final_by_default(StatusCode::PAYMENT_REQUIRED));
/// assert!(!idemkit_http::final_by_default(StatusCode::BAD_REQUEST));
/// assert!(!idemkit_http::final_by_default(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!idemkit_http::final_by_default(StatusCode::TOO_MANY_REQUESTS));
/// assert!(!idemkit_http::final_by_default(StatusCode::SERVICE_UNAVAILABLE));
/// ```
pub fn final_by_default(status: StatusCode) -> bool {
    status.is_success() || (status.is_client_error() && !REFUSALS.contains(&status.as_u16()))
}

/// The 4xx statuses that refuse a request before it executes (validation, authentication,
/// preconditions, limits, conflicts): not final, so a corrected or later retry with the same
/// key runs. Stripe saves a result only once the endpoint started executing; these are the
/// answers an endpoint gives before that.
const REFUSALS: [u16; 22] = [
    400, 401, 403, 405, 406, 407, 408, 409, 411, 412, 413, 414, 415, 417, 421, 422, 423, 425, 426,
    428, 429, 431,
];

/// The last [`RecentRuns::KEPT`] handler run times of a layer, for a `Retry-After` that fits
/// the route.
#[derive(Debug, Default)]
pub(crate) struct RecentRuns {
    runs: std::sync::Mutex<std::collections::VecDeque<Duration>>,
}

impl<S> Config<S> {
    /// One of the layer's problems, under the API's documentation if it has one.
    pub(crate) fn problem<B: From<bytes::Bytes>>(
        &self,
        p: Problem,
        detail: &str,
    ) -> http::Response<B> {
        p.render(detail, None, self.problem_docs.as_deref())
    }
}

impl RecentRuns {
    const KEPT: usize = 32;

    pub(crate) fn record(&self, run: Duration) {
        let mut runs = self
            .runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if runs.len() == Self::KEPT {
            runs.pop_front();
        }
        runs.push_back(run);
    }

    /// The median, once a run has ended.
    pub(crate) fn median(&self) -> Option<Duration> {
        let mut runs: Vec<Duration> = self
            .runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .copied()
            .collect();
        runs.sort_unstable();
        runs.get(runs.len() / 2).copied()
    }
}

/// A handler's own word on whether its response is final, as a response extension: it
/// overrides the layer's rule ([`final_when`](IdempotencyLayerBuilder::final_when)) for that
/// response.
///
/// # Example
///
/// ```
/// use http::{Response, StatusCode};
/// use idemkit_http::Finality;
///
/// // A declined card is an outcome: replay it, although it is a 4xx.
/// let mut resp = Response::new("card declined");
/// *resp.status_mut() = StatusCode::PAYMENT_REQUIRED;
/// resp.extensions_mut().insert(Finality::Final);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finality {
    /// Store the response and replay it to every retry with the key.
    Final,
    /// Do not store it: release the key, so a retry runs the handler again.
    NotFinal,
}

/// Configures an [`IdempotencyLayer`]. A scope rule is required:
/// [`scope_by`](IdempotencyLayerBuilder::scope_by) or [`global_scope`](IdempotencyLayerBuilder::global_scope).
pub struct IdempotencyLayerBuilder<S> {
    coordinator: Coordinator<S>,
    operation: Operation,
    scope: Option<ScopeRule>,
    methods: Vec<Method>,
    required: bool,
    max_body: usize,
    headers: Vec<HeaderName>,
    canonical_json: bool,
    authorization: bool,
    lenient: bool,
    retry_hint: Option<Duration>,
    problem_docs: Option<String>,
    keep: Vec<HeaderName>,
    is_final: fn(StatusCode) -> bool,
    in_flight: Option<InFlight>,
    ttl: Option<Duration>,
    on_store_error: Option<OnStoreError>,
    cancel_with_client: bool,
    in_progress_holder: bool,
}

impl<S> fmt::Debug for IdempotencyLayerBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("operation", &self.operation)
            .field("methods", &self.methods)
            .field("required", &self.required)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

/// Response headers that belong to the caller that got them: never stored, never replayed
/// ([`IdempotencyLayerBuilder::keep_headers`] refuses them).
const PER_CALLER: [&str; 7] = [
    "set-cookie",
    "set-cookie2",
    "authorization",
    "proxy-authorization",
    "cookie",
    "authentication-info",
    "proxy-authentication-info",
];

/// Whether a response header belongs to the caller that got it (`Set-Cookie`,
/// `Authorization`, ...): such a header is never stored, so a replay never hands one
/// caller's session to another ([`IdempotencyLayerBuilder::keep_headers`] refuses it).
///
/// ```
/// use idemkit_http::{http::header, is_per_caller};
/// assert!(is_per_caller(&header::SET_COOKIE));
/// assert!(!is_per_caller(&header::CONTENT_TYPE));
/// ```
pub fn is_per_caller(name: &HeaderName) -> bool {
    PER_CALLER.contains(&name.as_str())
}

/// Why a layer could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// Neither a scope function nor a global scope was chosen: keys would be shared between
    /// callers.
    NoScope,
    /// A response header that belongs to one caller (`Set-Cookie`, `Authorization`, ...)
    /// was asked to be kept: a replay would hand it to another.
    PerCallerHeader(HeaderName),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoScope => f.write_str(
                "the idempotency layer needs a scope: scope_by(..) for per-caller keys, or global_scope(..) to share keys on purpose",
            ),
            BuildError::PerCallerHeader(name) => write!(
                f,
                "the response header {name} belongs to one caller and cannot be stored and replayed"
            ),
        }
    }
}

impl std::error::Error for BuildError {}

impl<S: Store> IdempotencyLayerBuilder<S> {
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

    /// Request headers that are part of the fingerprint, besides `Authorization` (none by
    /// default).
    pub fn fingerprint_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.headers = names.into_iter().collect();
        self
    }

    /// Whether the request's `Authorization` header is part of the fingerprint (true by
    /// default). Within one scope, a request with another credential then never gets the
    /// stored response: it is refused as `422 key-reused`. Turn it off only when each
    /// caller has a scope of its own (`scope_by` the authenticated principal) and a
    /// client's credential may change between its retries (a refreshed access token):
    /// with it on, such a retry is refused instead of replayed.
    pub fn fingerprint_authorization(mut self, on: bool) -> Self {
        self.authorization = on;
        self
    }

    /// Accepts Stripe's bare keys that are not structured-field tokens: an unquoted key that
    /// starts with a digit (`Idempotency-Key: 8e03978e-40d5-...`), as many clients send UUIDs
    /// (false by default: the draft's Item syntax, see [`parse_key`] and
    /// [`parse_key_lenient`]).
    pub fn lenient_bare_keys(mut self, on: bool) -> Self {
        self.lenient = on;
        self
    }

    /// Fingerprints a JSON body by its value (on by default): member order, whitespace,
    /// string escapes and number spelling (`1.0`, `1e0`, `1`) do not count. A body is JSON by
    /// its `Content-Type` (`application/json` or a `+json` type; without one, if it parses);
    /// other bodies, and JSON that does not parse, count by their bytes. The canonical form is
    /// idemkit's own (members sorted by key), independent of serde_json's features. Off: every
    /// body by its bytes.
    pub fn canonical_json(mut self, on: bool) -> Self {
        self.canonical_json = on;
        self
    }

    /// The response headers stored and replayed (by default `content-type`,
    /// `content-language`, `location`, `etag`, `last-modified` and `cache-control`).
    /// Headers that belong to one caller (`Set-Cookie`, `Authorization`, `Cookie`,
    /// `Proxy-Authorization`, `Authentication-Info`, ...) are refused:
    /// [`build`](Self::build) fails with [`BuildError::PerCallerHeader`].
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
    /// or gets `409` with `Retry-After` (`Reject`), its body pointing to the original request
    /// (its attempt's id and the time left on its lease:
    /// [`binding::in_progress_response`]).
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.in_flight = Some(in_flight);
        self
    }

    /// Whether a `409 in-progress` names the process running the original request (its
    /// host, process id and holder name, as its reservation records them:
    /// `CoordinatorBuilder::holder_name`), where the store reports it (the MemoryStore and
    /// Redis; not the SQL stores). Off by default: host names and process ids are internal
    /// facts a public API should not hand its clients; turn it on for internal services,
    /// whose callers can then find the original's logs.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{Coordinator, InFlight, MemoryStore, Operation};
    /// use idemkit_http::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::builder(Coordinator::new(MemoryStore::new()), Operation::new("orders.create")?)
    ///     .global_scope("internal")?
    ///     .in_flight(InFlight::Reject)
    ///     .in_progress_holder(true)
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_progress_holder(mut self, show: bool) -> Self {
        self.in_progress_holder = show;
        self
    }

    /// The base URL of your API's documentation of the layer's errors: each problem's
    /// `type` becomes `<base>/<name>` (`https://docs.example.com/errors/key-reused`) instead
    /// of its entry in this crate's published documentation ([`PROBLEM_DOCS`], the default),
    /// and the answer links it (`Link: <type>; rel="describedby"; type="text/html"`), as the
    /// draft's examples do.
    pub fn problem_docs(mut self, base: impl Into<String>) -> Self {
        self.problem_docs = Some(base.into());
        self
    }

    /// Problem types as URNs (`urn:idemkit:problem:<name>`), with no `Link` header: for an
    /// API that links no documentation outside its own, and has none of the layer's errors.
    pub fn problem_urns(mut self) -> Self {
        self.problem_docs = None;
        self
    }

    /// How long a request with this layer typically runs: a concurrent retry refused with
    /// `409` is told to come back (`Retry-After`) after this minus how long the first request
    /// has run, at least 1 s, never more than its lease. Without it, the layer learns the
    /// figure: the median of the route's last 32 handler runs (until the first run ends, the
    /// time left on the lease).
    pub fn retry_hint(mut self, typical: Duration) -> Self {
        self.retry_hint = Some(typical);
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

    /// Whether a handler is cancelled when its client disconnects (false by default: once
    /// the key is reserved, the handler runs to its end in a task of its own, its response
    /// is stored, and the client's retry waits for it or replays it). `true` runs the
    /// handler inside the connection's future, which the server drops on disconnect: the
    /// effect may stop half-way, and the key stays reserved until its lease ends (or is
    /// released at once with the coordinator's `OnCancel::Release`).
    pub fn cancel_with_client(mut self, cancel: bool) -> Self {
        self.cancel_with_client = cancel;
        self
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`BuildError::NoScope`] without a scope rule; [`BuildError::PerCallerHeader`] when
    /// `keep_headers` names a header that belongs to one caller.
    pub fn build(self) -> Result<IdempotencyLayer<S>, BuildError> {
        let scope = self.scope.ok_or(BuildError::NoScope)?;
        if let Some(name) = self.keep.iter().find(|n| PER_CALLER.contains(&n.as_str())) {
            return Err(BuildError::PerCallerHeader(name.clone()));
        }
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
                authorization: self.authorization,
                lenient: self.lenient,
                retry_hint: self.retry_hint,
                problem_docs: self.problem_docs,
                recent: RecentRuns::default(),
                keep: Arc::new(self.keep),
                is_final: self.is_final,
                in_flight: self.in_flight,
                ttl: self.ttl,
                on_store_error: self.on_store_error,
                cancel_with_client: self.cancel_with_client,
                in_progress_holder: self.in_progress_holder,
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
    pub fn builder(
        coordinator: Coordinator<S>,
        operation: Operation,
    ) -> IdempotencyLayerBuilder<S> {
        IdempotencyLayerBuilder {
            coordinator,
            operation,
            scope: None,
            methods: vec![Method::POST, Method::PATCH],
            required: false,
            max_body: 1 << 20,
            headers: Vec::new(),
            canonical_json: true,
            authorization: true,
            lenient: false,
            retry_hint: None,
            problem_docs: Some(PROBLEM_DOCS.to_owned()),
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
            cancel_with_client: false,
            in_progress_holder: false,
        }
    }
}

impl<S, Svc> Layer<Svc> for IdempotencyLayer<S> {
    type Service = Idempotency<Svc, S>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Idempotency {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] makes: `inner`, with the `Idempotency-Key` header
/// honoured.
pub struct Idempotency<Svc, S> {
    inner: Svc,
    config: Arc<Config<S>>,
}

impl<Svc, S> Idempotency<Svc, S> {
    /// The inner service.
    pub fn get_ref(&self) -> &Svc {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut Svc {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> Svc {
        self.inner
    }
}

impl<Svc: Clone, S> Clone for Idempotency<Svc, S> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<Svc: fmt::Debug, S> fmt::Debug for Idempotency<Svc, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("operation", &self.config.operation)
            .finish_non_exhaustive()
    }
}

/// What the handler can read about its request's idempotency: a request extension for any
/// tower service, and an axum extractor (feature `axum`).
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

#[cfg(feature = "axum")]
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

pub mod binding;
mod body;
mod canonical;
mod capture;
mod key;
mod problem;
mod service;
mod stored;

/// axum, whose `Router::layer` the layer fits (with the `axum` feature, on by default).
#[cfg(feature = "axum")]
pub use axum;
pub use body::ResponseBody;
/// The HTTP types the layer's requests and responses are made of.
pub use http;
pub use key::{parse_key, parse_key_lenient};
pub use problem::{PROBLEM_DOCS, Problem};
pub use service::ResponseFuture;

/// Entry points for the fuzzer (`fuzz/`), not for applications: the stored-response decoder,
/// which reads bytes from the store.
#[doc(hidden)]
pub mod __fuzz {
    use idemkit_core::Codec as _;

    /// Decodes `bytes` as a stored response; on success, the status and the body's length.
    pub fn decode_response(bytes: &[u8]) -> Option<(u16, usize)> {
        let codec = crate::stored::ResponseCodec {
            keep: std::sync::Arc::new(Vec::new()),
        };
        let stored = codec.decode(bytes).ok()?;
        Some((stored.status.as_u16(), stored.body.len()))
    }
}
