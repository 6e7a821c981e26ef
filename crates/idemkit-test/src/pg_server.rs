//! A PostgreSQL server of a test's own, to restart and crash: `initdb` in a temporary
//! directory, started on a free loopback port from the machine's server binaries (the
//! newest `/usr/lib/postgresql/<version>/bin`, or `PG_BIN`), as the `postgres` user when
//! run as root (the server refuses root). Stopped and removed when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The server binaries' directory, if PostgreSQL is installed.
fn bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return Some(dir.into());
    }
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort();
    let dir = PathBuf::from(format!("/usr/lib/postgresql/{}/bin", versions.pop()?));
    dir.join("initdb").exists().then_some(dir)
}

/// Runs a server tool; whether it succeeded.
fn tool(name: &str, args: &[&str]) -> bool {
    let Some(bin) = bin() else { return false };
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    let mut c = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(name));
        c
    } else {
        Command::new(bin.join(name))
    };
    c.args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A running server of the test's own.
///
/// # Example
///
/// ```no_run
/// let server = idemkit_test::pg_server::PgServer::start().expect("PostgreSQL binaries");
/// assert!(server.crash() && server.start_again());
/// # let _ = server.url();
/// ```
#[derive(Debug)]
pub struct PgServer {
    dir: PathBuf,
    port: u16,
    tls: bool,
}

impl PgServer {
    /// `initdb` and start; the error says what is missing.
    pub fn start() -> Result<Self, String> {
        Self::start_inner(None)
    }

    /// [`start`](Self::start) with TLS on (`ssl=on`), serving `certs`' server certificate
    /// (for `127.0.0.1` and `localhost`); plain connections are still accepted.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let certs = idemkit_test::tls::TestCerts::make().expect("openssl");
    /// let server = idemkit_test::pg_server::PgServer::start_tls(&certs).expect("PostgreSQL");
    /// # let _ = server.url();
    /// ```
    pub fn start_tls(certs: &crate::tls::TestCerts) -> Result<Self, String> {
        Self::start_inner(Some(certs))
    }

    fn start_inner(certs: Option<&crate::tls::TestCerts>) -> Result<Self, String> {
        if bin().is_none() {
            return Err(
                "PostgreSQL server binaries (/usr/lib/postgresql/<version>/bin, or PG_BIN)".into(),
            );
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let dir = std::env::temp_dir().join(format!("idemkit-pg-{port}-{:x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let _ = Command::new("chown")
            .args(["postgres:postgres", &dir.to_string_lossy()])
            .status();
        let data = dir.join("data");
        let server = PgServer {
            dir,
            port,
            tls: certs.is_some(),
        };
        let made = tool(
            "initdb",
            &[
                "-D",
                &data.to_string_lossy(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        if let (true, Some(certs)) = (made, certs) {
            // The server wants its key its own and private: copies in its directory.
            for (from, to) in [
                (certs.server_cert(), "server.crt"),
                (certs.server_key(), "server.key"),
            ] {
                std::fs::copy(&from, server.dir.join(to)).map_err(|e| e.to_string())?;
                let to = server.dir.join(to).to_string_lossy().into_owned();
                let _ = Command::new("chown")
                    .args(["postgres:postgres", &to])
                    .status();
                let _ = Command::new("chmod").args(["600", &to]).status();
            }
        }
        if made && server.ctl(&["start"]) {
            Ok(server)
        } else {
            Err("a PostgreSQL server of the test's own (initdb, pg_ctl)".into())
        }
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn ctl(&self, what: &[&str]) -> bool {
        let data = self.dir.join("data");
        let log = self.dir.join("log");
        // fsync off: a killed server keeps what it committed (the OS has it); only a
        // machine crash would need the fsyncs.
        let mut opts = format!(
            "-p {} -k {} -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        );
        if self.tls {
            let dir = self.dir.display();
            opts.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={dir}/server.crt -c ssl_key_file={dir}/server.key"
            ));
        }
        let (data, log) = (data.to_string_lossy(), log.to_string_lossy());
        let mut args = vec!["-D", &data, "-o", &opts, "-l", &log, "-w"];
        args.extend_from_slice(what);
        tool("pg_ctl", &args)
    }

    /// A crash: `pg_ctl stop -m immediate` (every process quits at once, no checkpoint;
    /// the next start replays the WAL).
    pub fn crash(&self) -> bool {
        self.ctl(&["-m", "immediate", "stop"])
    }

    /// A clean restart: `pg_ctl stop -m fast` (a checkpoint), then start.
    pub fn restart(&self) -> bool {
        self.ctl(&["-m", "fast", "stop"]) && self.start_again()
    }

    /// Starts the stopped server again on the same port and data.
    pub fn start_again(&self) -> bool {
        self.ctl(&["start"])
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.crash();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
