//! Certificates for the TLS tests, made by the machine's `openssl` in a temporary directory
//! (removed on drop): a certificate authority, a server certificate for `127.0.0.1` and
//! `localhost` signed by it, a client certificate signed by it (for servers that ask
//! clients for one), and a second authority that signed nothing of these (a client that
//! trusts only it must refuse the server).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A certificate authority and what it signed, as PEM files.
///
/// # Example
///
/// ```no_run
/// let certs = idemkit_test::tls::TestCerts::make().expect("openssl");
/// assert!(certs.ca().exists() && certs.server_key().exists());
/// ```
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
}

impl TestCerts {
    /// Makes the authorities and certificates; the error says what failed.
    pub fn make() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("idemkit-tls-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let certs = TestCerts { dir };
        for ca in ["ca", "other-ca"] {
            certs.openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=idemkit test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ])?;
        }
        certs.sign(
            "server",
            "127.0.0.1",
            // Client authentication too: a Redis Cluster's nodes present it to each other on
            // their TLS bus.
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        )?;
        certs.sign("client", "idemkit", "extendedKeyUsage=clientAuth\n")?;
        // Readable by a server that runs as another user (PostgreSQL's `postgres`); a server
        // that wants its key private gets a copy of its own (`private_copy`).
        for entry in std::fs::read_dir(&certs.dir).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            let _ = Command::new("chmod").arg("a+rx").arg(&path).status();
        }
        let _ = Command::new("chmod").arg("a+rx").arg(&certs.dir).status();
        Ok(certs)
    }

    fn sign(&self, name: &str, cn: &str, extensions: &str) -> Result<(), String> {
        std::fs::write(self.dir.join(format!("{name}.ext")), extensions)
            .map_err(|e| e.to_string())?;
        self.openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ])?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ])
    }

    fn openssl(&self, args: &[&str]) -> Result<(), String> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("openssl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "openssl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The authority's certificate (what a client trusts).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Another authority's certificate, which signed neither the server's nor the client's.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }

    /// The server's certificate (for `127.0.0.1` and `localhost`).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }

    /// The server's private key.
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// The client's certificate.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    /// The client's private key.
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// Reads one of the files.
    ///
    /// # Panics
    ///
    /// If it cannot be read.
    pub fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
