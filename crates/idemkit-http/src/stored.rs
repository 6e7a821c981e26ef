//! A response as the layer stores it, and the binary codec it is stored with.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use idemkit_core::Codec;

/// A response as stored: status, the kept headers, the body bytes.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// A response that is not final: returned to the client, the key released.
pub(crate) struct NotFinal<B>(pub(crate) Response<B>);

/// Stored responses' own format (the body's bytes as they are, not JSON): `IDH1`, status
/// (2 bytes), header count (2), each header's name length (2), name, value length (4),
/// value; then the body. Only the kept headers are encoded.
#[derive(Clone)]
pub(crate) struct ResponseCodec {
    pub(crate) keep: Arc<Vec<HeaderName>>,
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
