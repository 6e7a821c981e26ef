//! The HTTP layer's decisions for the ASGI middleware (`idemkit/asgi.py`): the key's
//! syntax, the request's fingerprint, what is final, the stored response's format and the
//! problems, all from `idemkit-http` (`idemkit_http::binding`), so the Python middleware
//! answers as the tower layer does and a response one stores the other replays.

use idemkit_http::binding::{self, FingerprintRule, StoredResponse};
use idemkit_http::http::header::{HeaderName, HeaderValue};
use idemkit_http::http::{HeaderMap, Method, StatusCode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Headers as ASGI gives them: (name, value) byte pairs.
type Headers = Vec<(Vec<u8>, Vec<u8>)>;

fn header_map(headers: &Headers) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        // A header that is not one (the server would not pass it) counts as absent.
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            map.append(n, v);
        }
    }
    map
}

fn names(names: &[String]) -> PyResult<Vec<HeaderName>> {
    names
        .iter()
        .map(|n| {
            HeaderName::from_bytes(n.as_bytes())
                .map_err(|e| PyValueError::new_err(format!("{n:?} is not a header name: {e}")))
        })
        .collect()
}

fn status_of(status: u16) -> PyResult<StatusCode> {
    StatusCode::from_u16(status)
        .map_err(|_| PyValueError::new_err(format!("{status} is not an HTTP status")))
}

/// The key of an `Idempotency-Key` value (an RFC 8941 string or token; bare keys that start
/// with a digit only when `lenient`), checked as a key: `ValueError` with the reason.
#[pyfunction]
fn http_parse_key(value: &[u8], lenient: bool) -> PyResult<String> {
    let text = if lenient {
        idemkit_http::parse_key_lenient(value)
    } else {
        idemkit_http::parse_key(value)
    }
    .map_err(PyValueError::new_err)?;
    idemkit_core::Key::new(text.as_str()).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(text)
}

/// Whether a response of this status is stored and replayed by default.
#[pyfunction]
fn http_final_by_default(status: u16) -> PyResult<bool> {
    Ok(idemkit_http::final_by_default(status_of(status)?))
}

/// The request's fingerprint, 16 bytes, as the tower layer computes it.
#[pyfunction]
#[pyo3(signature = (method, path_and_query, headers, body, canonical_json=true, authorization=true, chosen=Vec::new()))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, as the builder's options
fn http_fingerprint<'py>(
    py: Python<'py>,
    method: &str,
    path_and_query: &str,
    headers: Headers,
    body: &[u8],
    canonical_json: bool,
    authorization: bool,
    chosen: Vec<String>,
) -> PyResult<Bound<'py, PyBytes>> {
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|e| PyValueError::new_err(format!("{method:?} is not a method: {e}")))?;
    let chosen = names(&chosen)?;
    let fp = binding::request_fingerprint(
        &method,
        path_and_query,
        &header_map(&headers),
        body,
        &FingerprintRule {
            canonical_json,
            authorization,
            headers: &chosen,
        },
    );
    Ok(PyBytes::new(py, &fp.to_bytes()))
}

/// A response in the stored format, its headers filtered to `keep`.
#[pyfunction]
fn http_encode_response<'py>(
    py: Python<'py>,
    status: u16,
    headers: Headers,
    body: Vec<u8>,
    keep: Vec<String>,
) -> PyResult<Bound<'py, PyBytes>> {
    let r = StoredResponse::new(status_of(status)?, header_map(&headers), body.into());
    let bytes = binding::encode_response(&r, &names(&keep)?)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(PyBytes::new(py, &bytes))
}

/// The stored format of a response too large to store: its status and its body's size.
#[pyfunction]
fn http_encode_omitted<'py>(
    py: Python<'py>,
    status: u16,
    size: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let r = StoredResponse::omitted(status_of(status)?, size);
    let bytes =
        binding::encode_response(&r, &[]).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(PyBytes::new(py, &bytes))
}

/// A stored response: `(status, headers, body, omitted size or None)`; `ValueError` for
/// bytes that are not one.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn http_decode_response<'py>(
    py: Python<'py>,
    data: &[u8],
) -> PyResult<(
    u16,
    Vec<(Vec<u8>, Vec<u8>)>,
    Bound<'py, PyBytes>,
    Option<u64>,
)> {
    let r = binding::decode_response(data).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let headers = r
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
    Ok((
        r.status.as_u16(),
        headers,
        PyBytes::new(py, &r.body),
        r.omitted,
    ))
}

/// A problem's answer: `(status, headers, body)`. `status` replaces the problem's own
/// (`result-unavailable` answers with the original request's).
#[pyfunction]
#[pyo3(signature = (name, detail, status=None, incident=None, docs=None))]
fn http_problem<'py>(
    py: Python<'py>,
    name: &str,
    detail: &str,
    status: Option<u16>,
    incident: Option<&str>,
    docs: Option<&str>,
) -> PyResult<Answer<'py>> {
    let problem = binding::problem_named(name)
        .ok_or_else(|| PyValueError::new_err(format!("no problem is named {name:?}")))?;
    let status = status.map(status_of).transpose()?;
    let r = binding::problem_response(problem, status, detail, incident, docs);
    Ok(answer(py, &r))
}

/// An answer as ASGI sends it: `(status, headers, body)`.
type Answer<'py> = (u16, Vec<(Vec<u8>, Vec<u8>)>, Bound<'py, PyBytes>);

/// `r` as ASGI sends it.
fn answer<'py>(py: Python<'py>, r: &idemkit_http::http::Response<bytes::Bytes>) -> Answer<'py> {
    let headers = r
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
    (r.status().as_u16(), headers, PyBytes::new(py, r.body()))
}

/// The `409 in-progress` answer (`idemkit_http::binding::in_progress_response`): `(status,
/// headers, body)`, the body pointing to the original (`attempt`, `lease_left_ms`, and
/// `holder` when given as `(host, pid, name)`).
#[pyfunction]
#[pyo3(signature = (docs, retry_after_secs, attempt, lease_left, holder=None))]
fn http_in_progress<'py>(
    py: Python<'py>,
    docs: Option<&str>,
    retry_after_secs: u64,
    attempt: Option<u64>,
    lease_left: f64,
    holder: Option<(String, u32, String)>,
) -> PyResult<Answer<'py>> {
    let holder =
        holder.map(|(host, pid, name)| idemkit_core::record::Holder::new(&host, pid, &name));
    let lease_left = std::time::Duration::try_from_secs_f64(lease_left.max(0.0))
        .map_err(|e| PyValueError::new_err(format!("lease_left: {e}")))?;
    let r = binding::in_progress_response(
        docs,
        retry_after_secs,
        attempt.map(idemkit_core::FencingToken::new),
        lease_left,
        holder.as_ref(),
    );
    Ok(answer(py, &r))
}

/// Whether a header may be kept with a stored response: not one that belongs to one caller
/// (`Set-Cookie`, `Authorization`, ...), which a replay would hand to another.
#[pyfunction]
fn http_is_per_caller(name: &str) -> bool {
    HeaderName::from_bytes(name.as_bytes()).is_ok_and(|n| idemkit_http::is_per_caller(&n))
}

/// A final response's body as the middleware takes it from the application: what is kept
/// to store, and whether each frame waits for the result to be stored. The Rust layer's
/// own state machine (`binding::Capture`), so both keep, hold and count alike.
#[pyclass(module = "idemkit._native")]
pub(crate) struct HttpCapture(Option<binding::Capture>);

impl HttpCapture {
    fn capture(&mut self) -> PyResult<&mut binding::Capture> {
        self.0.as_mut().ok_or_else(stored_already)
    }
}

fn stored_already() -> PyErr {
    PyValueError::new_err("this response was stored already")
}

#[pymethods]
impl HttpCapture {
    /// A capture for a response stored within `max_result_bytes`, which announced
    /// `announced` bytes (its `Content-Length`), if it did.
    #[new]
    #[pyo3(signature = (max_result_bytes, announced=None))]
    fn new(max_result_bytes: usize, announced: Option<u64>) -> Self {
        HttpCapture(Some(binding::Capture::new(max_result_bytes, announced)))
    }

    /// Takes the application's next body message: `True` when the frame waits for the
    /// result to be stored (it ends the body, or completes the announced length), `False`
    /// when it goes to the client now.
    fn push(&mut self, data: &[u8], end: bool) -> PyResult<bool> {
        let data = bytes::Bytes::copy_from_slice(data);
        let step = self.capture()?.push(Some(&data), end);
        Ok(step == binding::Step::Hold)
    }

    /// The body's bytes so far.
    #[getter]
    fn size(&self) -> u64 {
        self.0.as_ref().map_or(0, binding::Capture::size)
    }

    /// The response to store, in the stored format: its status, the `keep` headers and its
    /// body, or, past `max_result_bytes` (with the kept headers counted), its status and size.
    fn finish<'py>(
        &mut self,
        py: Python<'py>,
        status: u16,
        headers: Headers,
        keep: Vec<String>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let keep = names(&keep)?;
        let status = status_of(status)?;
        let mut kept = HeaderMap::new();
        for (name, value) in &header_map(&headers) {
            if keep.contains(name) {
                kept.append(name.clone(), value.clone());
            }
        }
        let capture = self.0.take().ok_or_else(stored_already)?;
        let r = capture.into_response(status, kept);
        let bytes = binding::encode_response(&r, &keep)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyBytes::new(py, &bytes))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<HttpCapture>()?;
    m.add("HTTP_PROBLEM_DOCS", idemkit_http::PROBLEM_DOCS)?;
    m.add_function(wrap_pyfunction!(http_parse_key, m)?)?;
    m.add_function(wrap_pyfunction!(http_final_by_default, m)?)?;
    m.add_function(wrap_pyfunction!(http_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(http_encode_response, m)?)?;
    m.add_function(wrap_pyfunction!(http_encode_omitted, m)?)?;
    m.add_function(wrap_pyfunction!(http_decode_response, m)?)?;
    m.add_function(wrap_pyfunction!(http_problem, m)?)?;
    m.add_function(wrap_pyfunction!(http_in_progress, m)?)?;
    m.add_function(wrap_pyfunction!(http_is_per_caller, m)?)?;
    Ok(())
}
