//! The problem details the layer answers with (RFC 9457).

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Response, StatusCode};

/// Where the layer's problems are documented by default: this enum's page in the crate's
/// published documentation. A problem's default `type` is this page with the problem's
/// variant as fragment (`…/enum.Problem.html#variant.KeyReused`), and the answer links it
/// (`Link: <type>; rel="describedby"; type="text/html"`), as the draft asks (§2.7).
pub const PROBLEM_DOCS: &str = concat!(
    "https://docs.rs/idemkit-http/",
    env!("CARGO_PKG_VERSION"),
    "/idemkit_http/enum.Problem.html"
);

/// The problems the layer answers with, as `application/problem+json` (RFC 9457): each has
/// a stable `type`, by default this page's entry for it ([`PROBLEM_DOCS`]), or
/// `<base>/<name>` under the API's own documentation with
/// [`problem_docs`](crate::IdempotencyLayerBuilder::problem_docs); either is linked
/// (`Link: <type>; rel="describedby"`). With
/// [`problem_urns`](crate::IdempotencyLayerBuilder::problem_urns) it is
/// `urn:idemkit:problem:<name>`, unlinked.
///
/// | problem | status | when |
/// |---|---|---|
/// | `missing-key` | 400 | the route requires the header and it is absent |
/// | `malformed-key` | 400 | the header is not a string or token, is empty, repeated, or over 255 characters |
/// | `unscoped-request` | 403 | the scope function could not scope the request |
/// | `body-too-large` | 413 | the body is over `max_body_bytes` |
/// | `unreadable-body` | 400 | the body could not be read |
/// | `in-progress` | 409 | reject mode: the first request with this key still runs (`Retry-After`; the body points to the original: [`binding::in_progress_response`](crate::binding::in_progress_response)) |
/// | `key-reused` | 422 | the key was used for a different request |
/// | `store-unavailable` | 503 | the store is down (fail closed); `Retry-After: 1`, the cause logged at `warn` |
/// | `result-unavailable` | the original status | a retry of a request whose response was too large to store (over the policy's `max_result_bytes`): executed, its response not kept |
/// | `internal` | 500 | a stored record that cannot be read, a response that could not be stored, a handler that panicked: the text is logged only, under the incident id the problem's `instance` carries |
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
    /// The request was executed, but its response was too large to store: a retry gets
    /// this with the original status (not an error status: the effect is done).
    ResultUnavailable,
}

impl Problem {
    /// Every problem.
    pub const ALL: [Problem; 10] = [
        Problem::MissingKey,
        Problem::MalformedKey,
        Problem::UnscopedRequest,
        Problem::BodyTooLarge,
        Problem::UnreadableBody,
        Problem::InProgress,
        Problem::KeyReused,
        Problem::StoreUnavailable,
        Problem::Internal,
        Problem::ResultUnavailable,
    ];

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
            Problem::ResultUnavailable => "result-unavailable",
        }
    }

    /// Its variant's name (`KeyReused`): the fragment of its entry on [`PROBLEM_DOCS`].
    fn variant(self) -> &'static str {
        match self {
            Problem::MissingKey => "MissingKey",
            Problem::MalformedKey => "MalformedKey",
            Problem::UnscopedRequest => "UnscopedRequest",
            Problem::BodyTooLarge => "BodyTooLarge",
            Problem::UnreadableBody => "UnreadableBody",
            Problem::InProgress => "InProgress",
            Problem::KeyReused => "KeyReused",
            Problem::StoreUnavailable => "StoreUnavailable",
            Problem::Internal => "Internal",
            Problem::ResultUnavailable => "ResultUnavailable",
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
            // Replaced by the original status when answered.
            Problem::ResultUnavailable => StatusCode::OK,
        }
    }

    /// The response: `application/problem+json` with `type`, `title`, `status`, `detail`.
    pub fn response<B: From<Bytes>>(self, detail: &str) -> Response<B> {
        self.render(detail, None, None)
    }

    /// The response for an error whose text stays in the log: a fixed `detail`, and the
    /// log line's incident id as `instance` (`urn:idemkit:incident:<id>`).
    pub fn incident_response<B: From<Bytes>>(self, incident: &str) -> Response<B> {
        self.render(
            "an internal error; the server's log has it under this incident id",
            Some(incident),
            None,
        )
    }

    /// The problem's `type`: `urn:idemkit:problem:<name>` without documentation;
    /// `<docs>/<name>` under the API's own documentation (see
    /// [`problem_docs`](crate::IdempotencyLayerBuilder::problem_docs)); and for a single page
    /// (`docs` ending in `.html`, as [`PROBLEM_DOCS`], the default), the page with the
    /// problem's variant as fragment.
    ///
    /// ```
    /// use idemkit_http::{PROBLEM_DOCS, Problem};
    /// assert_eq!(Problem::KeyReused.type_uri(None), "urn:idemkit:problem:key-reused");
    /// assert_eq!(
    ///     Problem::KeyReused.type_uri(Some("https://api.example.com/errors")),
    ///     "https://api.example.com/errors/key-reused"
    /// );
    /// assert_eq!(
    ///     Problem::KeyReused.type_uri(Some(PROBLEM_DOCS)),
    ///     format!("{PROBLEM_DOCS}#variant.KeyReused")
    /// );
    /// ```
    pub fn type_uri(self, docs: Option<&str>) -> String {
        match docs {
            Some(page) if page.ends_with(".html") => format!("{page}#variant.{}", self.variant()),
            Some(base) => format!("{}/{}", base.trim_end_matches('/'), self.name()),
            None => format!("urn:idemkit:problem:{}", self.name()),
        }
    }

    /// The response, with an incident id (`instance`) and documentation (`type` under
    /// `docs`, and a `Link: <type>; rel="describedby"` as the draft's examples show).
    pub(crate) fn render<B: From<Bytes>>(
        self,
        detail: &str,
        incident: Option<&str>,
        docs: Option<&str>,
    ) -> Response<B> {
        self.render_as(self.status(), detail, incident, docs)
    }

    /// [`render`](Self::render) under another status (`result-unavailable` answers with the
    /// original request's).
    pub(crate) fn render_as<B: From<Bytes>>(
        self,
        status: StatusCode,
        detail: &str,
        incident: Option<&str>,
        docs: Option<&str>,
    ) -> Response<B> {
        self.render_with(status, detail, incident, docs, serde_json::Map::new())
    }

    /// [`render_as`](Self::render_as) with extension members (RFC 9457 §3.2) beside the
    /// standard ones: what an `in-progress` answer says of the original request.
    pub(crate) fn render_with<B: From<Bytes>>(
        self,
        status: StatusCode,
        detail: &str,
        incident: Option<&str>,
        docs: Option<&str>,
        members: serde_json::Map<String, serde_json::Value>,
    ) -> Response<B> {
        let kind = self.type_uri(docs);
        let mut body = serde_json::json!({
            "type": kind,
            "title": if self == Problem::ResultUnavailable {
                "Result unavailable"
            } else {
                status.canonical_reason().unwrap_or("error")
            },
            "status": status.as_u16(),
            "detail": detail,
        });
        if let Some(id) = incident {
            body["instance"] = format!("urn:idemkit:incident:{id}").into();
        }
        for (name, value) in members {
            body[name] = value;
        }
        let mut resp = self.respond(body);
        *resp.status_mut() = status;
        if docs.is_some()
            && let Ok(link) = HeaderValue::from_str(&format!(
                "<{kind}>; rel=\"describedby\"; type=\"text/html\""
            ))
        {
            resp.headers_mut().insert(http::header::LINK, link);
        }
        resp
    }

    fn respond<B: From<Bytes>>(self, body: serde_json::Value) -> Response<B> {
        let mut resp = Response::new(B::from(Bytes::from(body.to_string())));
        *resp.status_mut() = self.status();
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        resp
    }
}
