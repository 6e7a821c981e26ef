//! The `Idempotency-Key` header's value: an RFC 8941 structured-field Item, as the draft
//! specifies (an sf-string, or an sf-token), its parameters ignored.

use crate::MAX_KEY_LEN;

/// Parses an `Idempotency-Key` header value as an RFC 8941 Item: an sf-string (`"abc"`, with
/// `\"` and `\\` escapes) or an sf-token (a letter or `*`, then letters, digits, `:`, `/` and
/// `!#$%&'*+-.^_`|~`), followed by any parameters (`;v=1`), which are checked and ignored;
/// at most [`MAX_KEY_LEN`] characters, not blank. A bare value that is not an sf-token
/// (`1abc`, `(x)`) is refused: a key that starts with a digit, as many UUIDs do, is sent
/// quoted (the draft's form), or accepted with
/// [`lenient_bare_keys`](crate::IdempotencyLayerBuilder::lenient_bare_keys) (see
/// [`parse_key_lenient`]).
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
/// assert_eq!(parse_key(b"\"8e03978e\";v=1").unwrap(), "8e03978e");
/// assert_eq!(parse_key(b"key-8e03978e").unwrap(), "key-8e03978e");
/// assert_eq!(parse_key(b"\"a \\\"quoted\\\" key\"").unwrap(), "a \"quoted\" key");
/// assert!(parse_key(b"8e03978e").is_err()); // not an sf-token: quote it
/// assert!(parse_key(b"").is_err());
/// assert!(parse_key(b"two words").is_err());
/// ```
pub fn parse_key(value: &[u8]) -> Result<String, &'static str> {
    parse(value, false)
}

/// [`parse_key`], and also Stripe's bare keys: an unquoted key may start with any token
/// character (a digit, as in `8e03978e-40d5-...`). Everything else is as strict.
///
/// # Errors
///
/// Why the value is not a key.
///
/// # Example
///
/// ```
/// use idemkit_http::parse_key_lenient;
/// assert_eq!(parse_key_lenient(b"8e03978e-40d5").unwrap(), "8e03978e-40d5");
/// assert!(parse_key_lenient(b"(x)").is_err());
/// ```
pub fn parse_key_lenient(value: &[u8]) -> Result<String, &'static str> {
    parse(value, true)
}

fn parse(value: &[u8], lenient: bool) -> Result<String, &'static str> {
    // RFC 8941 strips leading and trailing spaces (SP) before parsing.
    let value = value.trim_ascii();
    let mut p = Parser { s: value, i: 0 };
    let text = match p.peek() {
        Some(b'"') => p.string()?,
        Some(c) if c.is_ascii_alphabetic() || c == b'*' => p.token(),
        Some(c) if lenient && is_tchar(c) => p.token(),
        Some(_) => {
            return Err(
                "the key is neither a quoted string nor a token (a token starts with a letter or *; quote other keys)",
            );
        }
        None => return Err("the key is empty"),
    };
    p.parameters()?;
    if p.i != value.len() {
        return Err("the key is followed by characters that are not parameters");
    }
    if text.trim().is_empty() {
        return Err("the key is empty");
    }
    if text.chars().count() > MAX_KEY_LEN {
        return Err("the key is longer than 255 characters");
    }
    Ok(text)
}

fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn string(&mut self) -> Result<String, &'static str> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err("a quoted key must end with a quote");
            };
            self.i += 1;
            match c {
                b'\\' => match self.peek() {
                    Some(e @ (b'"' | b'\\')) => {
                        out.push(e as char);
                        self.i += 1;
                    }
                    _ => return Err("a quoted key may escape only \" and \\"),
                },
                b'"' => return Ok(out),
                0x20..=0x7e => out.push(c as char),
                _ => return Err("a key must be printable ASCII"),
            }
        }
    }

    fn token(&mut self) -> String {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|c| is_tchar(c) || c == b':' || c == b'/')
        {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }

    /// `*( ";" *SP key [ "=" bare-item ] )`, checked and dropped.
    fn parameters(&mut self) -> Result<(), &'static str> {
        while self.peek() == Some(b';') {
            self.i += 1;
            while self.peek() == Some(b' ') {
                self.i += 1;
            }
            match self.peek() {
                Some(c) if c.is_ascii_lowercase() || c == b'*' => {}
                _ => return Err("a parameter needs a name (lowercase letters first)"),
            }
            while self.peek().is_some_and(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(&c)
            }) {
                self.i += 1;
            }
            if self.peek() == Some(b'=') {
                self.i += 1;
                self.bare_item()?;
            }
        }
        Ok(())
    }

    /// A parameter's value: string, token, integer or decimal, byte sequence, boolean.
    fn bare_item(&mut self) -> Result<(), &'static str> {
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(c) if c.is_ascii_alphabetic() || c == b'*' => {
                self.token();
                Ok(())
            }
            Some(c) if c.is_ascii_digit() || c == b'-' => {
                self.i += 1;
                while self.peek().is_some_and(|c| c.is_ascii_digit() || c == b'.') {
                    self.i += 1;
                }
                Ok(())
            }
            Some(b':') => {
                self.i += 1;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || b"+/=".contains(&c))
                {
                    self.i += 1;
                }
                if self.peek() != Some(b':') {
                    return Err("a byte-sequence parameter must end with ':'");
                }
                self.i += 1;
                Ok(())
            }
            Some(b'?') => {
                self.i += 1;
                match self.peek() {
                    Some(b'0' | b'1') => {
                        self.i += 1;
                        Ok(())
                    }
                    _ => Err("a boolean parameter is ?0 or ?1"),
                }
            }
            _ => Err("a parameter's value is not a structured-field item"),
        }
    }
}
