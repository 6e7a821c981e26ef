//! Schema and table names, checked once so that they can be written into SQL text.

use std::fmt;

/// A schema or table name that is not one idemkit writes into SQL.
///
/// # Example
///
/// ```
/// use idemkit_postgres::PgStore;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// # let pool = sqlx::PgPool::connect_lazy("postgres://localhost/test")?;
/// let err = PgStore::builder().table("Records; DROP").build(pool).unwrap_err();
/// assert!(err.to_string().contains("Records; DROP"));
/// assert_eq!(err.what(), "table");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid {what} name {name:?}: use 1 to {MAX_NAME_LEN} of a-z, 0-9 and _, not starting with a digit"
)]
pub struct NameError {
    what: &'static str,
    name: String,
}

impl NameError {
    /// Which name was refused: `"schema"` or `"table"`.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// The name as it was given.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The longest schema or table name: short enough that `<table>_fencing` and the
/// notification channel `<schema>.<table>` stay within PostgreSQL's 63-byte identifiers.
pub const MAX_NAME_LEN: usize = 30;

pub(crate) fn check(what: &'static str, name: &str) -> Result<String, NameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(name.to_owned())
    } else {
        Err(NameError {
            what,
            name: name.to_owned(),
        })
    }
}

/// A table's schema and name, both checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    pub(crate) schema: String,
    pub(crate) name: String,
}

impl Table {
    /// `"schema"."name"`, for SQL text.
    pub(crate) fn quoted(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.name)
    }

    /// A migration's SQL for this table.
    pub(crate) fn fill(&self, sql: &str) -> String {
        sql.replace("{schema}", &self.schema)
            .replace("{table}", &self.name)
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["idemkit_records", "a", "_x1", &"a".repeat(MAX_NAME_LEN)] {
            assert!(check("table", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1a",
            "Records",
            "a-b",
            "a\"b",
            "a b",
            &"a".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(check("table", bad).is_err(), "{bad}");
        }
    }
}
