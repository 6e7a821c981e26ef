//! The layer's decisions as plain functions, for a binding of the same semantics to another
//! server interface: idemkit's Python package builds its ASGI middleware on these, so a
//! request is fingerprinted, a response stored and a problem answered as this crate's
//! [`IdempotencyLayer`](crate::IdempotencyLayer) does, byte for byte (a record stored by
//! one is replayed by the other). The key's syntax is [`parse_key`](crate::parse_key), what
//! is final [`final_by_default`](crate::final_by_default).

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, Method, StatusCode};
use idemkit_core::record::Holder;
use idemkit_core::{Codec, FencingToken, Fingerprint};

pub use crate::capture::{Capture, Step};
use crate::problem::Problem;
use crate::stored::{ResponseCodec, Stored};

/// What a request's fingerprint is made of, besides its method, path, query and body.
#[derive(Debug, Clone, Copy)]
pub struct FingerprintRule<'a> {
    /// A JSON body counts by its value (member order, whitespace, escapes and number
    /// spelling ignored): the layer's `canonical_json`, on by default.
    pub canonical_json: bool,
    /// The request's `Authorization` counts: the layer's `fingerprint_authorization`, on by
    /// default.
    pub authorization: bool,
    /// Headers that count too (the layer's `fingerprint_headers`).
    pub headers: &'a [HeaderName],
}

impl Default for FingerprintRule<'_> {
    fn default() -> Self {
        FingerprintRule {
            canonical_json: true,
            authorization: true,
            headers: &[],
        }
    }
}

/// The fingerprint the layer gives a request: its method, path and query (`/` when empty),
/// its `Authorization` and chosen headers as the rule says, and its body, a JSON body by
/// its value (its `Content-Type` is `application/json` or `+json`, or it has none and the
/// body parses).
///
/// # Example
///
/// ```
/// use http::{HeaderMap, Method};
/// use idemkit_http::binding::{FingerprintRule, request_fingerprint};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("content-type", "application/json".parse().unwrap());
/// let rule = FingerprintRule::default();
/// let a = request_fingerprint(&Method::POST, "/pay", &headers, br#"{"a":1,"b":2}"#, &rule);
/// let b = request_fingerprint(&Method::POST, "/pay", &headers, br#"{ "b": 2, "a": 1.0 }"#, &rule);
/// assert_eq!(a, b);
/// headers.insert("authorization", "Bearer other".parse().unwrap());
/// assert_ne!(a, request_fingerprint(&Method::POST, "/pay", &headers, br#"{"a":1,"b":2}"#, &rule));
/// ```
pub fn request_fingerprint(
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: &[u8],
    rule: &FingerprintRule<'_>,
) -> Fingerprint {
    let canonical;
    let json = rule.canonical_json && json_body(headers) != Some(false);
    let body: &[u8] = match json.then(|| serde_json::from_slice::<serde_json::Value>(body)) {
        Some(Ok(v)) => {
            canonical = crate::canonical::canonical(&v);
            canonical.as_bytes()
        }
        _ => body,
    };
    let path = if path_and_query.is_empty() {
        "/"
    } else {
        path_and_query
    };
    let mut fields: Vec<&[u8]> = vec![method.as_str().as_bytes(), path.as_bytes()];
    // The credential: within a scope, another caller's request is another request. Its
    // hash only is stored (the fingerprint), never the header.
    if rule.authorization {
        fields.push(b"authorization");
        for v in headers.get_all(http::header::AUTHORIZATION) {
            fields.push(v.as_bytes());
        }
    }
    for name in rule.headers {
        fields.push(name.as_str().as_bytes());
        for v in headers.get_all(name) {
            fields.push(v.as_bytes());
        }
    }
    fields.push(body);
    Fingerprint::of_parts(fields)
}

/// Whether a request's body is JSON by its `Content-Type` (`application/json`, or any
/// `+json` type); `None` when it has none.
fn json_body(headers: &HeaderMap) -> Option<bool> {
    let ct = headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = ct
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    Some(essence == "application/json" || essence.ends_with("+json"))
}

/// A response as the layer stores it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoredResponse {
    /// Its status.
    pub status: StatusCode,
    /// The headers kept (the layer's `keep_headers`).
    pub headers: HeaderMap,
    /// The body's bytes, as they were; empty when `omitted`.
    pub body: Bytes,
    /// For a response too large to store: its body's size. Only the status is kept, and a
    /// retry is answered [`Problem::ResultUnavailable`] under that status.
    pub omitted: Option<u64>,
}

impl StoredResponse {
    /// A response to store whole.
    pub fn new(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        StoredResponse {
            status,
            headers,
            body,
            omitted: None,
        }
    }

    /// A response too large to store: its status and its body's size.
    pub fn omitted(status: StatusCode, size: u64) -> Self {
        StoredResponse {
            status,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            omitted: Some(size),
        }
    }
}

/// Encodes a response in the layer's stored format, keeping only the `keep` headers.
///
/// # Errors
///
/// More than 65,535 headers kept, or a header over 4 GiB.
///
/// # Example
///
/// ```
/// use http::{HeaderMap, StatusCode, header::CONTENT_TYPE};
/// use idemkit_http::binding::{StoredResponse, decode_response, encode_response};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(CONTENT_TYPE, "application/json".parse().unwrap());
/// headers.insert("x-request-id", "r-1".parse().unwrap());
/// let sent = StoredResponse::new(StatusCode::CREATED, headers, "{\"id\":1}".into());
/// let bytes = encode_response(&sent, &[CONTENT_TYPE]).unwrap();
/// let back = decode_response(&bytes).unwrap();
/// assert_eq!((back.status, back.body.as_ref()), (StatusCode::CREATED, &b"{\"id\":1}"[..]));
/// assert_eq!(back.headers.len(), 1, "only the kept header");
/// ```
pub fn encode_response(
    response: &StoredResponse,
    keep: &[HeaderName],
) -> Result<Vec<u8>, idemkit_core::store::BoxError> {
    ResponseCodec {
        keep: std::sync::Arc::new(keep.to_vec()),
    }
    .encode(&Stored {
        status: response.status,
        headers: response.headers.clone(),
        body: response.body.clone(),
        omitted: response.omitted,
    })
}

/// Decodes a response the layer (or a binding) stored.
///
/// # Errors
///
/// The bytes are not a stored response (another codec's record, or cut short).
pub fn decode_response(bytes: &[u8]) -> Result<StoredResponse, idemkit_core::store::BoxError> {
    let s = ResponseCodec {
        keep: std::sync::Arc::new(Vec::new()),
    }
    .decode(bytes)?;
    Ok(StoredResponse {
        status: s.status,
        headers: s.headers,
        body: s.body,
        omitted: s.omitted,
    })
}

/// A problem as the layer answers it: its status (`status` for
/// [`Problem::ResultUnavailable`], which answers with the original request's), its
/// headers (`Content-Type: application/problem+json`, and a `Link` to `docs`) and its body.
/// `incident` is the log's id for an internal error (the body's `instance`).
///
/// # Example
///
/// ```
/// use idemkit_http::{Problem, binding::problem_response};
///
/// let r = problem_response(Problem::KeyReused, None, "another request used this key", None, None);
/// assert_eq!(r.status(), 422);
/// assert_eq!(r.headers()["content-type"], "application/problem+json");
/// let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
/// assert_eq!(body["type"], "urn:idemkit:problem:key-reused");
/// ```
pub fn problem_response(
    problem: Problem,
    status: Option<StatusCode>,
    detail: &str,
    incident: Option<&str>,
    docs: Option<&str>,
) -> http::Response<Bytes> {
    problem.render_as(
        status.unwrap_or_else(|| problem.status()),
        detail,
        incident,
        docs,
    )
}

/// The `409 in-progress` answer to a duplicate refused while the original request runs
/// (reject mode), as the Rust layer and the Python ASGI middleware both give it: the
/// problem with `Retry-After: retry_after_secs` (at least 1), and beside the standard
/// members a pointer to the original, so the caller can find it rather than only wait:
///
/// | member | what |
/// |---|---|
/// | `attempt` | the original attempt's id, a decimal string: its reservation's fencing token, the same for as long as it runs (`idemkit inspect` and the log's `fencing` show it) |
/// | `lease_left_ms` | the time left on the original's lease: its response exists by then, or the key is free |
/// | `holder` | `{"host", "pid", "name"}` of the process running it: only when the layer shows it ([`in_progress_holder`](crate::IdempotencyLayerBuilder::in_progress_holder)) and the store reports it |
///
/// Neither the IETF draft nor Stripe define a header for this, so the pointer is in the body
/// only; `Retry-After` is the header both use.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::FencingToken;
/// use idemkit_core::record::Holder;
/// use idemkit_http::binding::in_progress_response;
///
/// let holder = Holder::new("worker-3", 4242, "billing");
/// let r = in_progress_response(None, 2, Some(FencingToken::new(17)), Duration::from_millis(1500), Some(&holder));
/// assert_eq!(r.status(), 409);
/// assert_eq!(r.headers()["retry-after"], "2");
/// let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
/// assert_eq!(body["attempt"], "17");
/// assert_eq!(body["lease_left_ms"], 1500);
/// assert_eq!(body["holder"]["host"], "worker-3");
/// assert_eq!(body["holder"]["pid"], 4242);
/// ```
pub fn in_progress_response(
    docs: Option<&str>,
    retry_after_secs: u64,
    attempt: Option<FencingToken>,
    lease_left: std::time::Duration,
    holder: Option<&Holder>,
) -> http::Response<Bytes> {
    let mut members = serde_json::Map::new();
    if let Some(attempt) = attempt {
        // A string: a fencing token can pass 2^53, past what a JSON number keeps exactly
        // in JavaScript.
        members.insert("attempt".into(), attempt.get().to_string().into());
    }
    let ms = u64::try_from(lease_left.as_millis()).unwrap_or(u64::MAX);
    members.insert("lease_left_ms".into(), ms.into());
    if let Some(h) = holder {
        members.insert(
            "holder".into(),
            serde_json::json!({ "host": h.host, "pid": h.pid, "name": h.name }),
        );
    }
    let mut r: http::Response<Bytes> = Problem::InProgress.render_with(
        Problem::InProgress.status(),
        "a request with this key is still being processed; retry later",
        None,
        docs,
        members,
    );
    r.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from(retry_after_secs.max(1)),
    );
    r
}

/// A problem by its name (`"key-reused"`), as [`Problem::name`] gives it.
///
/// ```
/// use idemkit_http::{Problem, binding::problem_named};
/// assert_eq!(problem_named("in-progress"), Some(Problem::InProgress));
/// assert_eq!(problem_named("nope"), None);
/// ```
pub fn problem_named(name: &str) -> Option<Problem> {
    Problem::ALL.into_iter().find(|p| p.name() == name)
}

/// How long one frame of a final, streamed response may wait for room towards its client:
/// a third of the lease (so that a stalled client never costs the owner more than a renewal
/// interval per frame), and no more than 10 s. Past it the client is dropped from the
/// stream (it gets a cut-off body) and the handler's response goes on to be stored, so a
/// client that stops reading can neither hold the key nor make its retry run the handler
/// again. The Rust layer and the Python ASGI middleware both pace by it.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_http::binding::client_pace;
///
/// assert_eq!(client_pace(Duration::from_secs(15)), Duration::from_secs(5));
/// assert_eq!(client_pace(Duration::from_secs(60)), Duration::from_secs(10));
/// ```
pub fn client_pace(lease: std::time::Duration) -> std::time::Duration {
    (lease / 3).min(std::time::Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_found_by_its_name() {
        for p in Problem::ALL {
            assert_eq!(problem_named(p.name()), Some(p));
        }
    }

    #[test]
    fn an_omitted_response_round_trips() {
        let bytes = encode_response(&StoredResponse::omitted(StatusCode::CREATED, 9), &[]).unwrap();
        let back = decode_response(&bytes).unwrap();
        assert_eq!((back.status, back.omitted), (StatusCode::CREATED, Some(9)));
        assert!(decode_response(b"{\"json\":1}").is_err());
    }
}
