//! A final response's body as the layer takes it from the handler: what is kept to store,
//! and which frame waits for the result to be stored. One state machine for the Rust layer
//! and the Python ASGI middleware (`binding::Capture`): before, each had its own, and the
//! copies drifted (review M5, L5 of `e047556`).

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};

use crate::binding::StoredResponse;

/// Room left in `max_result_bytes` for the stored response's status and kept headers: a
/// body is kept while it fits in the rest.
pub(crate) const HEADROOM: usize = 4096;

/// What a frame of a final response does next ([`Capture::push`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// Send it to the client now (at the handler's pace: waiting at most
    /// [`client_pace`](crate::binding::client_pace) for the client to make room).
    Forward,
    /// Hold it until the result is stored, then send it with the body's end: it is the body's
    /// last frame, or the one that completes the length the response announced (a client
    /// takes that as the end too). A client that has the whole body and retries must find
    /// the result stored.
    Hold,
}

/// A final response's body as it comes from the handler: a copy kept up to what may be
/// stored (`max_result_bytes` less room for the status and headers; past it, only the size),
/// and, frame by frame, whether the frame goes to the client now or waits for the result to
/// be stored ([`Step`]).
///
/// # Example
///
/// ```
/// use bytes::Bytes;
/// use http::{HeaderMap, StatusCode};
/// use idemkit_http::binding::{Capture, Step};
///
/// // A response that announced 10 bytes, streamed in two frames.
/// let mut capture = Capture::new(1 << 20, Some(10));
/// assert_eq!(capture.push(Some(&Bytes::from_static(b"hello")), false), Step::Forward);
/// // The frame that completes the announced length waits for the result to be stored.
/// assert_eq!(capture.push(Some(&Bytes::from_static(b"world")), false), Step::Hold);
/// let stored = capture.into_response(StatusCode::OK, HeaderMap::new());
/// assert_eq!((&stored.body[..], stored.omitted), (&b"helloworld"[..], None));
///
/// // A body larger than what may be stored: its status and size only.
/// let mut capture = Capture::new(8 << 10, None);
/// capture.push(Some(&Bytes::from(vec![0; 16 << 10])), true);
/// let stored = capture.into_response(StatusCode::OK, HeaderMap::new());
/// assert_eq!(stored.omitted, Some(16 << 10));
/// ```
#[derive(Debug)]
pub struct Capture {
    limit: usize,
    storable: usize,
    announced: Option<u64>,
    seen: u64,
    kept: Kept,
}

/// The kept copy. A body of one frame (most are) is kept without a copy.
#[derive(Debug, Default)]
enum Kept {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
    Over,
}

impl Capture {
    /// A capture for a response stored within `max_result_bytes` (the coordinator's bound
    /// for the operation), which announced `announced` bytes (its `Content-Length`, or the
    /// exact size its body reports), if it did.
    pub fn new(max_result_bytes: usize, announced: Option<u64>) -> Self {
        Capture {
            limit: max_result_bytes,
            storable: max_result_bytes.saturating_sub(HEADROOM),
            announced,
            seen: 0,
            kept: Kept::Empty,
        }
    }

    /// The length the response announced, once known (the Rust layer learns a streamed
    /// body's exact size only after its first frames).
    pub fn announce(&mut self, announced: Option<u64>) {
        self.announced = announced;
    }

    /// Takes the handler's next frame: its data, if it is a data frame, and whether the
    /// handler's body ends with it. Keeps a copy while the body fits what may be stored.
    pub fn push(&mut self, data: Option<&Bytes>, end: bool) -> Step {
        if let Some(data) = data {
            self.keep(data);
        }
        if end || self.announced.is_some_and(|n| self.seen >= n) {
            Step::Hold
        } else {
            Step::Forward
        }
    }

    fn keep(&mut self, data: &Bytes) {
        let size = self.seen as usize;
        self.seen += data.len() as u64;
        if matches!(self.kept, Kept::Over) {
            return;
        }
        if size + data.len() > self.storable {
            self.kept = Kept::Over;
            return;
        }
        self.kept = match std::mem::take(&mut self.kept) {
            Kept::Empty => Kept::One(data.clone()),
            Kept::One(first) => {
                let mut many = BytesMut::with_capacity(first.len() + data.len());
                many.extend_from_slice(&first);
                many.extend_from_slice(data);
                Kept::Many(many)
            }
            Kept::Many(mut many) => {
                many.extend_from_slice(data);
                Kept::Many(many)
            }
            Kept::Over => Kept::Over,
        };
    }

    /// The body is past what may be stored: from here on the layer keeps only its size, and
    /// streams the rest through.
    pub fn is_over(&self) -> bool {
        matches!(self.kept, Kept::Over)
    }

    /// The body's bytes so far.
    pub fn size(&self) -> u64 {
        self.seen
    }

    /// The response to store, with `headers` (the kept ones only): its body, or, past what
    /// may be stored (a body over its room, or kept headers that take more than the room
    /// left them), its status and size only.
    pub fn into_response(self, status: StatusCode, headers: HeaderMap) -> StoredResponse {
        let body = match self.kept {
            Kept::Empty => Bytes::new(),
            Kept::One(b) => b,
            Kept::Many(b) => b.freeze(),
            Kept::Over => return StoredResponse::omitted(status, self.seen),
        };
        if crate::stored::encoded_len(&headers, body.len()) > self.limit {
            return StoredResponse::omitted(status, self.seen);
        }
        StoredResponse::new(status, headers, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    #[test]
    fn the_last_frame_and_the_one_that_completes_the_announced_length_are_held() {
        let mut c = Capture::new(1 << 20, None);
        assert_eq!(c.push(Some(&frame(3)), false), Step::Forward);
        assert_eq!(c.push(None, true), Step::Hold, "trailers that end the body");
        let mut c = Capture::new(1 << 20, None);
        c.announce(Some(6));
        assert_eq!(c.push(Some(&frame(3)), false), Step::Forward);
        assert_eq!(c.push(Some(&frame(3)), false), Step::Hold);
        assert_eq!(
            c.push(Some(&frame(0)), true),
            Step::Hold,
            "what follows joins it"
        );
    }

    /// Review L10 (of `aee2f71`) and L5 (of `e047556`): kept headers count against the bound.
    #[test]
    fn headers_that_take_more_than_their_room_store_the_status_and_size_only() {
        let limit = 8 << 10;
        let body = limit - HEADROOM;
        let mut headers = HeaderMap::new();
        headers.insert("x-big", "v".repeat(HEADROOM).parse().unwrap());
        let mut c = Capture::new(limit, None);
        c.push(Some(&frame(body)), true);
        assert!(!c.is_over(), "the body alone fits its room");
        let stored = c.into_response(StatusCode::OK, headers);
        assert_eq!(stored.omitted, Some(body as u64));
        assert!(stored.headers.is_empty());
    }

    #[test]
    fn a_body_over_its_room_keeps_counting_its_size() {
        let mut c = Capture::new(8 << 10, None);
        c.push(Some(&frame(3000)), false);
        c.push(Some(&frame(3000)), false);
        assert!(c.is_over());
        c.push(Some(&frame(10)), true);
        let stored = c.into_response(StatusCode::CREATED, HeaderMap::new());
        assert_eq!(
            (stored.status, stored.omitted),
            (StatusCode::CREATED, Some(6010))
        );
    }
}
