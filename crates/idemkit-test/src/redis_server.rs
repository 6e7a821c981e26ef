//! Redis servers a test owns: one `redis-server` on a free port, or a three-primary Cluster,
//! each stopped when dropped. For tests that restart or fail a server, or need a Cluster.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The server binary the tests start: `IDEMKIT_REDIS_SERVER` (a path, e.g. Valkey's
/// `valkey-server`), or `redis-server` from the `PATH`. The client tool stays `redis-cli`,
/// which speaks to both.
pub fn server_binary() -> String {
    std::env::var("IDEMKIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// A free TCP port on loopback whose cluster-bus port (+10000) is free too.
pub fn free_port() -> u16 {
    loop {
        let p = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p < 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

/// A `redis-server` this test owns, on its own port, killed on drop. Wrapped in `timeout`
/// so that a test process that dies cannot leave it running.
#[derive(Debug)]
pub struct RedisProcess {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    binary: String,
    child: Option<Child>,
}

impl RedisProcess {
    /// Starts `redis-server` with `extra` arguments on a free port.
    ///
    /// # Panics
    ///
    /// If `redis-server` is missing or does not answer.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_as(&server_binary(), extra)
    }

    /// Starts `binary` (a `redis-server` or a `valkey-server`) with `extra` arguments on a
    /// free port.
    ///
    /// # Panics
    ///
    /// If `binary` is missing or does not answer.
    pub fn start_as(binary: &str, extra: &[&str]) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("idemkit-redis-{port}-{:x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = RedisProcess {
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            binary: binary.to_string(),
            child: None,
        };
        p.restart();
        p
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port, empty: nothing is persisted.
    ///
    /// # Panics
    ///
    /// If it is running, or does not start.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("timeout")
            .args([
                "--kill-after=5",
                "900",
                &self.binary,
                "--port",
                &self.port.to_string(),
            ])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        for _ in 0..200 {
            if redis_ping(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// Starts (again) on the same port, empty, from another server binary: a failover to
    /// a server of another version (Redis 7 after Valkey 9, and back).
    ///
    /// # Panics
    ///
    /// As [`restart`](Self::restart).
    pub fn restart_as(&mut self, binary: &str) {
        self.binary = binary.to_string();
        self.restart();
    }

    /// Stops it (a later [`restart`](Self::restart) starts it again, empty).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM to `timeout`, which passes it on to redis-server and reaps it.
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
            for _ in 0..200 {
                if !redis_ping(self.port) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether a server answers `PING` on `port`.
pub fn redis_ping(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "ping"])
        .output()
        .map(|o| o.status.success() && o.stdout.starts_with(b"PONG"))
        .unwrap_or(false)
}

/// A Cluster of three primaries (no replicas), on free ports.
#[derive(Debug)]
pub struct Cluster {
    /// Its nodes.
    pub nodes: Vec<RedisProcess>,
}

impl Cluster {
    /// Starts the nodes and creates the Cluster; returns once every node says
    /// `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// If `redis-server` or `redis-cli` is missing, or the Cluster does not form.
    pub fn start() -> Self {
        Self::start_nodes(&server_binary(), |_| Vec::new(), None)
    }

    /// A Cluster over TLS, from Debian's `redis-server` (built with TLS): each node serves
    /// `certs`' server certificate on a TLS port beside its plain one, and the nodes talk
    /// TLS to each other (`--tls-cluster yes`), so a client on a TLS port is told the
    /// nodes' TLS ports. Also returns each node's TLS port.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_tls(certs: &crate::tls::TestCerts) -> (Self, Vec<u16>) {
        // Their cluster bus is on the TLS port + 10000 (`free_port` keeps that one free too).
        let tls_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let ca = certs.ca().to_string_lossy().into_owned();
        let cluster = Self::start_nodes(
            "redis-server",
            |i| {
                vec![
                    "--tls-port".to_string(),
                    tls_ports[i].to_string(),
                    "--tls-cluster".to_string(),
                    "yes".to_string(),
                    "--tls-cert-file".to_string(),
                    certs.server_cert().to_string_lossy().into_owned(),
                    "--tls-key-file".to_string(),
                    certs.server_key().to_string_lossy().into_owned(),
                    "--tls-ca-cert-file".to_string(),
                    certs.ca().to_string_lossy().into_owned(),
                    "--tls-auth-clients".to_string(),
                    "no".to_string(),
                ]
            },
            // Created through the TLS ports: `CLUSTER MEET` derives each bus port from them.
            Some((&tls_ports, &ca)),
        );
        (cluster, tls_ports)
    }

    fn start_nodes(
        binary: &str,
        extra: impl Fn(usize) -> Vec<String>,
        tls: Option<(&[u16], &str)>,
    ) -> Self {
        let nodes: Vec<_> = (0..3)
            .map(|i| {
                let mut args: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                args.extend(extra(i));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                RedisProcess::start_as(binary, &args)
            })
            .collect();
        let addrs: Vec<String> = match tls {
            None => nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port))
                .collect(),
            Some((ports, _)) => ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
        };
        let mut create = Command::new("redis-cli");
        if let Some((_, ca)) = tls {
            create.args(["--tls", "--cacert", ca]);
        }
        let out = create
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for n in &nodes {
            wait_for(
                || cluster_info(n.port).contains("cluster_state:ok"),
                "cluster_state:ok",
            );
        }
        Cluster { nodes }
    }

    /// Each node's `redis://` URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisProcess::url).collect()
    }
}

fn cluster_info(port: u16) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "cluster", "info"])
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Keys held by the server on `port`.
pub fn dbsize(port: u16) -> u64 {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "dbsize"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn wait_for(mut ok: impl FnMut() -> bool, what: &str) {
    for _ in 0..400 {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("timed out waiting for {what}");
}
