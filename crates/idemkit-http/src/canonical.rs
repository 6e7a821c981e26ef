//! A JSON value's one spelling, for the request fingerprint: object members sorted by key
//! (bytewise), no whitespace, strings re-escaped the one way serde_json writes them, numbers
//! by value (an integral number as an integer, `1.0` and `1e0` as `1`; others in exponent
//! form). Written here rather than left to `serde_json::Value`'s `Display`, whose member
//! order follows serde_json's `preserve_order` feature: any crate in the program can turn
//! it on, and the fingerprint of the same request would change with it.

use serde_json::Value;

/// The canonical text of `v`.
pub(crate) fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

fn write(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => number(n, out),
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(k, out);
                out.push(':');
                write(item, out);
            }
            out.push('}');
        }
    }
}

fn string(s: &str, out: &mut String) {
    // serde_json escapes exactly `"`, `\` and control characters, always the same way.
    out.push_str(&serde_json::to_string(s).expect("a string serialises"));
}

/// Integral values up to 2^53 (exact in a double) as integers, whatever their spelling.
const EXACT: f64 = 9_007_199_254_740_992.0;

fn number(n: &serde_json::Number, out: &mut String) {
    use std::fmt::Write as _;
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        if f.fract() == 0.0 && f.abs() <= EXACT {
            let _ = write!(out, "{}", f as i64);
        } else {
            // The shortest spelling that reads back as the same double.
            let _ = write!(out, "{f:e}");
        }
    } else {
        out.push_str(&n.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::canonical;

    fn c(text: &str) -> String {
        canonical(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn one_value_one_spelling() {
        assert_eq!(
            c(r#"{ "b": 1, "a": {"d": [true, null], "c": "x"} }"#),
            r#"{"a":{"c":"x","d":[true,null]},"b":1}"#
        );
        assert_eq!(c(r#""caf\u00e9""#), c(r#""café""#));
        assert_eq!(c(r#""\/""#), c(r#""/""#));
        assert_eq!(c("1.0"), "1");
        assert_eq!(c("1e2"), "100");
        assert_eq!(c("-0.0"), "0");
        assert_eq!(c("1.50"), c("1.5"));
        assert_eq!(c("1.5"), "1.5e0");
        assert_eq!(c("123456789012345678901234567890"), "1.2345678901234568e29");
        assert_ne!(c("1"), c(r#""1""#));
        assert_ne!(c("[1,2]"), c("[2,1]"));
        // Keys sort by their bytes, after unescaping.
        assert_eq!(c(r#"{"\u0062": 1, "a": 2}"#), r#"{"a":2,"b":1}"#);
    }
}
