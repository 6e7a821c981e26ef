//! The `Idempotency-Key` header's value: the draft's string or Stripe's token.

use crate::MAX_KEY_LEN;

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
