//! The servers a run owns, so that it may restart, kill and fail them over: Redis (AOF on,
//! `appendfsync always`) and a replica of it (the PostgreSQL of its own is
//! `idemkit_test::pg_server`), and a TCP proxy in front of Redis that cuts every connection on demand and moves them
//! to a promoted replica.

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub(crate) fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    for _ in 0..300 {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not within 15 s");
}

/// Sends a signal to a process (`kill -STOP`, `-CONT`, `-KILL`).
pub(crate) fn signal(pid: u32, sig: &str) {
    // A pause may end after its worker was killed: no such process, nothing to say.
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// `redis-cli -p PORT args...`, its output.
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// One redis-server of the run, with its data directory.
#[derive(Debug)]
pub(crate) struct Redis {
    pub(crate) port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Redis {
    pub(crate) fn start(dir: &Path, replica_of: Option<u16>) -> Self {
        let port = free_port();
        let dir = dir.join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let mut r = Redis {
            port,
            dir,
            child: None,
        };
        r.spawn(replica_of);
        r
    }

    fn spawn(&mut self, replica_of: Option<u16>) {
        // IDEMKIT_REDIS_SERVER: another server binary (Valkey's, scripts/valkey).
        let binary =
            std::env::var("IDEMKIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let mut c = Command::new(binary);
        c.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--dir", self.dir.to_str().expect("utf-8 path")])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                // A replica's full resync starts at once: the default waits 5 s for more
                // replicas, and a failover's guarded calls are refused until the resync
                // ends, so most of a short failover run was spent refusing (seed 568374:
                // one job refused on each delivery until the deadline).
                "--repl-diskless-sync-delay",
                "0",
            ])
            .args(["--logfile", "redis.log"]);
        if let Some(p) = replica_of {
            c.args(["--replicaof", "127.0.0.1", &p.to_string()]);
        }
        self.child = Some(
            c.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server"),
        );
        let port = self.port;
        wait_until("redis up", || redis_cli(port, &["ping"]) == "PONG");
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// A clean restart: `SHUTDOWN` (the AOF is flushed), then the same data directory.
    pub(crate) fn restart_clean(&mut self, replica_of: Option<u16>) {
        redis_cli(self.port, &["shutdown"]);
        self.reap();
        self.spawn(replica_of);
    }

    /// Killed (`SIGKILL`), then started on the same data directory.
    pub(crate) fn crash(&mut self) {
        signal(self.pid(), "KILL");
        self.reap();
    }

    /// Empties the data directory of a stopped server (it comes back with nothing).
    pub(crate) fn wipe(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::create_dir_all(&self.dir);
    }

    pub(crate) fn start_again(&mut self, replica_of: Option<u16>) {
        self.spawn(replica_of);
    }

    fn reap(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let port = self.port;
        wait_until("redis down", || !port_open(port));
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A TCP proxy in front of Redis: the workers' only way to it, so a run can cut every
/// connection at once and move them all to a promoted replica.
#[derive(Debug, Clone)]
pub(crate) struct Proxy {
    pub(crate) port: u16,
    target: Arc<AtomicU16>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Proxy {
    pub(crate) async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let port = listener.local_addr().expect("proxy addr").port();
        let proxy = Proxy {
            port,
            target: Arc::new(AtomicU16::new(target)),
            conns: Arc::default(),
        };
        let p = proxy.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let target = p.target.load(Ordering::SeqCst);
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                let mut conns = p.conns.lock().unwrap_or_else(PoisonError::into_inner);
                conns.retain(|c| !c.is_finished());
                conns.push(task.abort_handle());
            }
        });
        proxy
    }

    /// Drops every connection through the proxy (both ends see a reset).
    pub(crate) fn cut(&self) {
        for c in self
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            c.abort();
        }
    }

    /// Cuts every connection and refuses new ones (they are sent to a closed port) until
    /// the next [`switch`](Proxy::switch): a replica behind this proxy falls behind.
    pub(crate) fn block(&self) {
        self.switch(free_port());
    }

    /// Sends new connections to `port`, and cuts the old ones.
    pub(crate) fn switch(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
        self.cut();
    }
}
