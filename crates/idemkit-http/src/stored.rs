//! A response as the layer stores it, and the binary codec it is stored with.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use idemkit_core::Codec;

/// A response as stored: status, the kept headers, the body bytes; or, for a response too
/// large to store (`omitted`: its body's size), only its status.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) omitted: Option<u64>,
}

/// A response that is not final: returned to the client, the key released.
pub(crate) struct NotFinal<B>(pub(crate) Response<B>);

/// Stored responses' own format (the body's bytes as they are, not JSON): `IDH1`, status
/// (2 bytes), header count (2), each header's name length (2), name, value length (4),
/// value; then the body. Only the kept headers are encoded.
/// A response too large to store is `IDU1`, status (2), the body's size (8).
#[derive(Clone)]
pub(crate) struct ResponseCodec {
    pub(crate) keep: Arc<Vec<HeaderName>>,
}

impl Codec<Stored> for ResponseCodec {
    fn encode(&self, r: &Stored) -> Result<Vec<u8>, idemkit_core::store::BoxError> {
        // (`encoded_len` below counts exactly what this writes.)
        if let Some(size) = r.omitted {
            let mut out = Vec::with_capacity(14);
            out.extend_from_slice(b"IDU1");
            out.extend_from_slice(&r.status.as_u16().to_be_bytes());
            out.extend_from_slice(&size.to_be_bytes());
            return Ok(out);
        }
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
        let u16_of = |s: &[u8]| u16::from_be_bytes([s[0], s[1]]);
        match take(&mut b, 4)? {
            b"IDH1" => {}
            b"IDU1" => {
                let status = StatusCode::from_u16(u16_of(take(&mut b, 2)?))?;
                let size = take(&mut b, 8)?;
                let size = u64::from_be_bytes(size.try_into().map_err(|_| "a size cut short")?);
                if !b.is_empty() {
                    return Err("bytes after a stored response's size".into());
                }
                return Ok(Stored {
                    status,
                    headers: HeaderMap::new(),
                    body: Bytes::new(),
                    omitted: Some(size),
                });
            }
            _ => return Err("not a stored HTTP response".into()),
        }
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
            omitted: None,
        })
    }
}

/// The size [`ResponseCodec`] encodes a response of these (kept) headers and body to.
pub(crate) fn encoded_len(headers: &http::HeaderMap, body: usize) -> usize {
    8 + headers
        .iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum::<usize>()
        + body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_too_large_to_store_keeps_its_status_and_size() {
        let codec = ResponseCodec {
            keep: Arc::new(vec![http::header::CONTENT_TYPE]),
        };
        let marker = Stored {
            status: StatusCode::CREATED,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            omitted: Some(5_000_000),
        };
        let bytes = codec.encode(&marker).unwrap();
        assert_eq!(bytes.len(), 14);
        let back = codec.decode(&bytes).unwrap();
        assert_eq!(
            (back.status, back.omitted),
            (StatusCode::CREATED, Some(5_000_000))
        );
        assert!(codec.decode(&bytes[..13]).is_err(), "cut short");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(codec.decode(&longer).is_err(), "trailing bytes");
    }

    #[test]
    fn encoded_len_is_what_encode_writes() {
        let codec = ResponseCodec {
            keep: Arc::new(vec![http::header::CONTENT_TYPE, http::header::LOCATION]),
        };
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, "text/plain".parse().unwrap());
        headers.append(http::header::LOCATION, "/a".parse().unwrap());
        headers.append(http::header::LOCATION, "/bb".parse().unwrap());
        let body = Bytes::from_static(b"hello");
        let len = encoded_len(&headers, body.len());
        let r = Stored {
            status: StatusCode::OK,
            headers,
            body,
            omitted: None,
        };
        assert_eq!(codec.encode(&r).unwrap().len(), len);
    }
}
