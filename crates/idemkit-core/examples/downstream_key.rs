//! Prints the downstream key of each effect read from stdin, one per line as
//! `operation<TAB>scope<TAB>key` (an empty scope for none), optionally keyed with the secret
//! given as the first argument. The same effect gets the same key in every process: the
//! tests compare this program's keys with their own.
//!
//! ```text
//! printf 'mail.invoice\t\torder-9.invoice\n' | cargo run -p idemkit-core --example downstream_key
//! ```

use std::io::BufRead as _;

use idemkit_core::{DownstreamKey, DownstreamSecret, Key, Operation, Scope, StorageKey};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::args()
        .nth(1)
        .map(|s| DownstreamSecret::new(s.into_bytes()))
        .transpose()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut parts = line.splitn(3, '\t');
        let (Some(op), Some(scope), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("not operation<TAB>scope<TAB>key: {line:?}").into());
        };
        let scope = (!scope.is_empty()).then(|| Scope::new(scope)).transpose()?;
        let sk = StorageKey::new(&Operation::new(op)?, scope.as_ref(), &Key::new(key)?);
        println!("{}", DownstreamKey::of_storage_key(&sk, secret.as_ref()));
    }
    Ok(())
}
