//! A MariaDB server of a test's own: `mariadb-install-db` in a temporary directory, then
//! `mariadbd` on a free loopback port (as the `mysql` user when run as root), with TLS from
//! the test's certificates. For what the machine's server cannot be given at run time (its
//! certificates are read-only settings). Killed and removed when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::tls::TestCerts;

/// A running server, `root` without a password, database `test`.
///
/// # Example
///
/// ```no_run
/// let certs = idemkit_test::tls::TestCerts::make().expect("openssl");
/// let server = idemkit_test::mysql_server::MySqlServer::start_tls(&certs).expect("MariaDB");
/// # let _ = server.url();
/// ```
#[derive(Debug)]
pub struct MySqlServer {
    dir: PathBuf,
    port: u16,
    child: Child,
}

fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"))
}

fn first_of(names: &[&'static str]) -> Option<&'static str> {
    names.iter().copied().find(|n| {
        Command::new("sh")
            .args(["-c", &format!("command -v {n}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

impl MySqlServer {
    /// Installs a data directory and starts the server with TLS on (`ssl-cert`, `ssl-key`,
    /// `ssl-ca` from `certs`); plain connections are still accepted. The error says what
    /// is missing or failed.
    pub fn start_tls(certs: &TestCerts) -> Result<Self, String> {
        let install = first_of(&["mariadb-install-db", "mysql_install_db"])
            .ok_or("mariadb-install-db (apt-get install mariadb-server)")?;
        let server = first_of(&["mariadbd", "mysqld"]).ok_or("mariadbd")?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let dir =
            std::env::temp_dir().join(format!("idemkit-mysql-{port}-{:x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let data = dir.join("data");
        // A temporary directory of the server's own: a server starting removes every
        // `#sql*` file of its `tmpdir`, so servers sharing `/tmp` (the tests start theirs
        // at once, beside the machine's) delete each other's temporary tables mid-install
        // ("Could not remove temporary table", then `Unknown table 'mysql.tmp_user_sys'`).
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
        let as_root = root();
        if as_root {
            let _ = Command::new("chown")
                .args(["-R", "mysql:mysql", &dir.to_string_lossy()])
                .status();
        }
        let mut c = Command::new(install);
        c.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        if as_root {
            c.arg("--user=mysql");
        }
        let out = c.output().map_err(|e| format!("{install}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{install}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let mut c = Command::new("timeout");
        c.args(["--kill-after=5", "900", server, "--no-defaults"])
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--ssl-cert={}", certs.server_cert().display()))
            .arg(format!("--ssl-key={}", certs.server_key().display()))
            .arg(format!("--ssl-ca={}", certs.ca().display()))
            .args(["--skip-log-bin", "--innodb-buffer-pool-size=16M"])
            .arg(format!("--log-error={}", dir.join("error.log").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if as_root {
            c.arg("--user=mysql");
        }
        let child = c.spawn().map_err(|e| format!("{server}: {e}"))?;
        let server = MySqlServer { dir, port, child };
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                let made = Command::new(first_of(&["mariadb", "mysql"]).ok_or("mariadb")?)
                    .args(["-h", "127.0.0.1", "-P", &port.to_string(), "-u", "root"])
                    .args(["-e", "CREATE DATABASE IF NOT EXISTS test"])
                    .output()
                    .is_ok_and(|o| o.status.success());
                if made {
                    return Ok(server);
                }
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let log = std::fs::read_to_string(server.dir.join("error.log")).unwrap_or_default();
        Err(format!("mariadbd did not start: {log}"))
    }

    /// `mysql://root@127.0.0.1:<port>/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }
}

impl Drop for MySqlServer {
    fn drop(&mut self) {
        // SIGTERM to `timeout`, which passes it on to the server.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
