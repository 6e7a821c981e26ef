//! What the `idemkit serve` tests share: the server as a child process.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

/// A running `idemkit serve`, stopped on drop.
pub(crate) struct Server {
    child: Child,
    pub(crate) base: String,
}

impl Server {
    /// `idemkit serve` with `store` (`--store URL` and its naming options) and `extra`.
    pub(crate) fn start(store: &[&str], extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idemkit"))
            .arg("serve")
            .args(store)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line
            .strip_prefix("listening on ")
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("serve said {line:?}"))
            .trim_end_matches('/')
            .to_string();
        Server { child, base }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
