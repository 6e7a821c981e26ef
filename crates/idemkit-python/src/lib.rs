//! The native half of the Python package `idemkit` (built by maturin: `scripts/python wheel`).
//!
//! The Python half (`python/idemkit/`) owns what a Python user touches: the coordinator's call
//! builder, the codecs, the exceptions and the idempotency-kit drop-in. This module owns what
//! must be the Rust core's: the stores, the reservation, the lease renewal, the fencing, the
//! wake-ups of waiters and the record format, so that a record written here is the record a
//! Rust service writes (and replays), byte for byte.
//!
//! # One call, split in two
//!
//! A call is one [`Call::run`](idemkit_core::Call::run) on the tokio runtime, whose action is
//! a hand-off to Python: `Coordinator.begin` starts it and returns at once; the call replies
//! when it has its answer (a replay, or an error: nothing to run) or reaches its action, and
//! then hands over a `Begun` with the [`Attempt`]. The Python action
//! runs in the caller's own asyncio task (its context variables, its cancellation), and
//! `Begun.complete` or `Begun.fail` finish the Rust call with its outcome. A `Begun` dropped
//! or cancelled without an outcome aborts the Rust call at its action: the same as dropping a
//! Rust call's future there (the lease is left to expire, ARCHITECTURE.md rows 17 and 41),
//! never a completion.
//!
//! # Replies without the GIL
//!
//! The runtime's threads never take the GIL: a reply is queued as a Rust value and the event
//! loop is woken through a socket it watches (`Bridge`: one byte per batch of replies), and
//! Python objects are made on the loop's thread when it drains the queue.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit_core::{
    Attempt, DynStore, Error, Fingerprint, InFlight, Key, OnStoreError, Operation, Policy, Scope,
    StoreErrorKind,
};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The action's failure, as the Rust call sees it: the exception itself stays in Python,
/// where it is raised again once the reservation is released.
#[derive(Debug)]
struct ActionFailed;

impl std::fmt::Display for ActionFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the action raised")
    }
}

/// The action's result as Python encoded it, or why Python's codec could not encode it (the
/// effect happened: the core keeps the key completed as "result unavailable", so a retry
/// does not run the action again).
#[derive(Debug)]
enum Encoded {
    Bytes(Vec<u8>),
    Unencodable(String),
}

/// Hands Python's bytes to the store as they are.
#[derive(Debug, Clone, Copy)]
struct Handoff;

impl idemkit_core::Codec<Encoded> for Handoff {
    fn encode(&self, value: &Encoded) -> Result<Vec<u8>, idemkit_core::BoxError> {
        match value {
            Encoded::Bytes(bytes) => Ok(bytes.clone()),
            Encoded::Unencodable(reason) => Err(reason.clone().into()),
        }
    }

    fn decode(&self, bytes: &[u8]) -> Result<Encoded, idemkit_core::BoxError> {
        Ok(Encoded::Bytes(bytes.to_vec()))
    }
}

/// What Python hands the waiting action: its result, or that it raised.
type Handed = Option<Encoded>;

/// Raises the Python exception `name` of `idemkit._errors`, built from `args`.
fn raise<'py, A>(py: Python<'py>, name: &str, args: A) -> PyErr
where
    A: pyo3::call::PyCallArgs<'py>,
{
    let built = py
        .import("idemkit._errors")
        .and_then(|m| m.getattr(name))
        .and_then(|class| class.call1(args));
    match built {
        Ok(exception) => PyErr::from_value(exception),
        Err(e) => e,
    }
}

/// The Python exception for a core error (the action's own failure is raised by Python).
fn error_to_py(py: Python<'_>, e: Error<ActionFailed>) -> PyErr {
    let message = e.to_string();
    match e {
        Error::InvalidKey(k) => raise(py, "InvalidKey", (k.to_string(),)),
        Error::Config { reason } => raise(py, "ConfigError", (reason,)),
        Error::InFlight {
            retry_after,
            lease_left,
            held_for,
        } => raise(
            py,
            "InProgress",
            (
                message,
                retry_after.as_secs_f64(),
                lease_left.as_secs_f64(),
                held_for.map(|d| d.as_secs_f64()),
            ),
        ),
        Error::KeyReused => raise(py, "KeyReused", (message,)),
        Error::ResultUnavailable { reason } => raise(py, "ResultUnavailable", (reason,)),
        Error::Decode(source) => raise(py, "DecodeError", (source.to_string(),)),
        Error::Store { phase, source } => {
            let class = match source.kind() {
                StoreErrorKind::Unavailable => "StoreUnavailable",
                _ => "StoreError",
            };
            raise(
                py,
                class,
                (message, phase.to_string(), format!("{:?}", source.kind())),
            )
        }
        // The action's failure: Python holds the exception and raises it itself.
        Error::Action(ActionFailed) => raise(py, "IdemkitError", ("the action failed",)),
        other => raise(py, "IdemkitError", (other.to_string(),)),
    }
}

fn store_error_to_py(py: Python<'_>, e: idemkit_core::StoreError) -> PyErr {
    let class = match e.kind() {
        StoreErrorKind::Unavailable => "StoreUnavailable",
        _ => "StoreError",
    };
    raise(
        py,
        class,
        (e.to_string(), "connect", format!("{:?}", e.kind())),
    )
}

/// The runtime every call runs on (pyo3-async-runtimes' tokio runtime, started on first use).
fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

fn seconds(name: &'static str, secs: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "{name} must be a positive number of seconds, got {secs}"
            ))
        })
}

/// A store the coordinator can use: MemoryStore, RedisStore or PostgresStore.
#[pyclass(frozen, module = "idemkit._native", subclass)]
#[derive(Debug, Clone)]
struct Store {
    inner: DynStore,
    name: &'static str,
}

#[pymethods]
impl Store {
    fn __repr__(&self) -> String {
        format!("<idemkit {} {:?}>", self.name, self.inner)
    }
}

/// The in-process store: records live in this process only (tests, one worker).
#[pyfunction]
fn memory_store() -> Store {
    Store {
        inner: DynStore::new(idemkit_core::MemoryStore::new()),
        name: "MemoryStore",
    }
}

/// Connects to Redis (one node). `prefix` is the Redis key prefix every record lives under
/// (the Rust crate's default, `idemkit`, so both languages share records by default).
#[pyfunction]
#[pyo3(signature = (url, prefix=None))]
fn redis_store(py: Python<'_>, url: String, prefix: Option<String>) -> PyResult<Bound<'_, PyAny>> {
    connect_redis(py, prefix, move |builder| async move {
        builder.connect(&url).await
    })
}

/// Connects to a Redis Cluster through any of its nodes.
#[pyfunction]
#[pyo3(signature = (urls, prefix=None))]
fn redis_cluster_store(
    py: Python<'_>,
    urls: Vec<String>,
    prefix: Option<String>,
) -> PyResult<Bound<'_, PyAny>> {
    connect_redis(py, prefix, async move |builder| {
        builder
            .connect_cluster(urls.iter().map(String::as_str))
            .await
    })
}

fn connect_redis<F, Fut>(
    py: Python<'_>,
    prefix: Option<String>,
    connect: F,
) -> PyResult<Bound<'_, PyAny>>
where
    F: FnOnce(idemkit_redis::RedisStoreBuilder) -> Fut + Send + 'static,
    Fut: Future<Output = Result<idemkit_redis::RedisStore, idemkit_core::StoreError>> + Send,
{
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let mut builder = idemkit_redis::RedisStore::builder();
        if let Some(prefix) = prefix {
            builder = builder.prefix(prefix);
        }
        let store = connect(builder)
            .await
            .map_err(|e| Python::attach(|py| store_error_to_py(py, e)))?;
        Ok(Store {
            inner: DynStore::with_raw(store),
            name: "RedisStore",
        })
    })
}

/// Connects to PostgreSQL and migrates the table (`table`, default `idemkit_records`).
#[pyfunction]
#[pyo3(signature = (url, table=None))]
fn postgres_store(
    py: Python<'_>,
    url: String,
    table: Option<String>,
) -> PyResult<Bound<'_, PyAny>> {
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let mut builder = idemkit_postgres::PgStore::builder();
        if let Some(table) = table {
            builder = builder.table(&table);
        }
        let py_err = |e| Python::attach(|py| store_error_to_py(py, e));
        let store = builder.connect(&url).await.map_err(py_err)?;
        // Idempotent, and serialised by an advisory lock: every worker may run it.
        store.migrate().await.map_err(py_err)?;
        Ok(Store {
            inner: DynStore::with_raw(store),
            name: "PostgresStore",
        })
    })
}

fn in_flight_of(mode: &str) -> PyResult<InFlight> {
    match mode {
        "wait" => Ok(InFlight::Wait),
        "reject" | "raise" => Ok(InFlight::Reject),
        "run" => Ok(InFlight::Run),
        other => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "in_flight must be 'wait', 'reject' or 'run', got {other:?}"
        ))),
    }
}

/// The coordinator: one per process and store, shared by every task.
#[pyclass(frozen, module = "idemkit._native")]
#[derive(Debug)]
struct Coordinator {
    inner: idemkit_core::Coordinator<DynStore>,
}

#[pymethods]
impl Coordinator {
    #[new]
    #[pyo3(signature = (store, *, lease=None, wait_timeout=None, fail_open=false, holder_name=None))]
    fn new(
        store: &Store,
        lease: Option<f64>,
        wait_timeout: Option<f64>,
        fail_open: bool,
        holder_name: Option<String>,
    ) -> PyResult<Self> {
        let mut policy = Policy::default();
        if let Some(lease) = lease {
            policy = policy.lease(seconds("lease", lease)?);
        }
        if let Some(wait) = wait_timeout {
            policy = policy.wait_timeout(seconds("wait_timeout", wait)?);
        }
        if fail_open {
            policy = policy.on_store_error(OnStoreError::FailOpen);
        }
        let mut builder = idemkit_core::Coordinator::builder(store.inner.clone()).policy(policy);
        if let Some(name) = holder_name {
            builder = builder.holder_name(&name);
        }
        Ok(Coordinator {
            inner: builder.build(),
        })
    }

    /// Starts a call on the runtime and returns at once: `bridge` gets the call's first
    /// reply under `id` (the stored result's bytes, a [`Begun`] whose action the caller runs
    /// now, or the call's error). The returned [`Pending`] aborts the call if the caller
    /// stops waiting.
    #[pyo3(signature = (bridge, id, operation, key, ttl, in_flight="wait", fingerprint=None, scope=None))]
    #[allow(clippy::too_many_arguments)]
    fn begin(
        &self,
        py: Python<'_>,
        bridge: &Bridge,
        id: u64,
        operation: &str,
        key: &str,
        ttl: f64,
        in_flight: &str,
        fingerprint: Option<&[u8]>,
        scope: Option<&str>,
    ) -> PyResult<Pending> {
        let invalid = |e: idemkit_core::KeyError| raise(py, "InvalidKey", (e.to_string(),));
        let operation = Operation::new(operation).map_err(invalid)?;
        let key = Key::new(key).map_err(invalid)?;
        let scope = scope.map(Scope::new).transpose().map_err(invalid)?;
        let ttl = seconds("ttl", ttl)?;
        let mode = in_flight_of(in_flight)?;
        let fingerprint = fingerprint.map(Fingerprint::of);

        let coordinator = self.inner.clone();
        let wake = bridge.wake.clone();
        let call = runtime().spawn(async move {
            // The id the call's last reply goes under: the begin's, until the action hands
            // over its outcome with the id its completion waits under.
            let mut reply_to = id;
            let reply_to_ref = &mut reply_to;
            let outcome = coordinator
                .call_owned(operation, key)
                .scope_owned(scope)
                .ttl(ttl)
                .in_flight(mode)
                .fingerprint(fingerprint)
                .codec(Handoff)
                .run(|attempt| {
                    let (tx, rx) = oneshot::channel::<(Handed, u64)>();
                    wake.push(id, Reply::Begun(attempt, tx));
                    async move {
                        match rx.await {
                            Ok((handed, completion)) => {
                                *reply_to_ref = completion;
                                handed.ok_or(ActionFailed)
                            }
                            // The Python side dropped its Begun without an outcome: it
                            // aborts this task too, so this only waits to be dropped.
                            Err(_) => std::future::pending().await,
                        }
                    }
                })
                .await;
            let reply = match outcome {
                Ok(receipt) if reply_to == id => match receipt.into_value() {
                    Encoded::Bytes(bytes) => Reply::Replay(bytes),
                    Encoded::Unencodable(reason) => Reply::Unencodable(reason),
                },
                Ok(receipt) => Reply::Stored(receipt.stored),
                Err(Error::Action(ActionFailed)) => Reply::Stored(false),
                Err(e) => Reply::Error(e),
            };
            wake.push(reply_to, reply);
        });
        Ok(Pending {
            call: Mutex::new(Some(call)),
        })
    }
}

/// The call a [`Coordinator::begin`] started, until its first reply.
#[pyclass(frozen, module = "idemkit._native")]
#[derive(Debug)]
struct Pending {
    call: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl Pending {
    /// The caller stopped waiting (cancelled): the call is dropped where it is.
    fn abort(&self) {
        if let Some(call) = self.call.lock().expect("not poisoned").take() {
            call.abort();
        }
    }

    /// The call reached its action: the [`Begun`] owns it from now on.
    fn hand_over(&self, begun: &Begun) {
        let call = self.call.lock().expect("not poisoned").take();
        *begun.call.lock().expect("not poisoned") = call;
    }
}

/// A reply of the runtime to the event loop, made a Python value only there (the runtime's
/// threads never take the GIL).
enum Reply {
    Replay(Vec<u8>),
    Unencodable(String),
    Begun(Attempt, oneshot::Sender<(Handed, u64)>),
    Stored(bool),
    Error(Error<ActionFailed>),
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reply::Replay(_) => "Replay",
            Reply::Unencodable(_) => "Unencodable",
            Reply::Begun(..) => "Begun",
            Reply::Stored(_) => "Stored",
            Reply::Error(_) => "Error",
        })
    }
}

/// The replies waiting for the event loop, and the socket that wakes it: one byte per batch
/// of replies (`signalled` is set by the push that finds the batch empty, cleared by the
/// drain that takes it), so a loop under load is woken once for many calls.
#[derive(Debug)]
struct Wake {
    replies: Mutex<Vec<(u64, Reply)>>,
    signalled: AtomicBool,
    tx: UnixStream,
}

impl Wake {
    fn push(&self, id: u64, reply: Reply) {
        self.replies.lock().expect("not poisoned").push((id, reply));
        if !self.signalled.swap(true, Ordering::AcqRel) {
            // A full socket buffer already holds a wake-up: nothing is lost by dropping one.
            let _ = (&self.tx).write(&[1]);
        }
    }
}

/// One per event loop: `fileno()` goes to `loop.add_reader`, whose callback calls `drain()`
/// and settles the futures by id.
#[pyclass(frozen, module = "idemkit._native")]
#[derive(Debug)]
struct Bridge {
    wake: Arc<Wake>,
    rx: UnixStream,
}

#[pymethods]
impl Bridge {
    #[new]
    fn new() -> PyResult<Self> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok(Bridge {
            wake: Arc::new(Wake {
                replies: Mutex::new(Vec::new()),
                signalled: AtomicBool::new(false),
                tx,
            }),
            rx,
        })
    }

    /// The socket the event loop watches.
    fn fileno(&self) -> i32 {
        self.rx.as_raw_fd()
    }

    /// The replies since the last drain: `(id, ok, value)`, `value` an exception when not ok.
    fn drain(&self, py: Python<'_>) -> PyResult<Vec<(u64, bool, Py<PyAny>)>> {
        let mut buf = [0u8; 64];
        while matches!((&self.rx).read(&mut buf), Ok(n) if n > 0) {}
        self.wake.signalled.store(false, Ordering::Release);
        let replies = std::mem::take(&mut *self.wake.replies.lock().expect("not poisoned"));
        let mut out = Vec::with_capacity(replies.len());
        for (id, reply) in replies {
            let (ok, value) = match reply {
                Reply::Replay(bytes) => (true, PyBytes::new(py, &bytes).into_any().unbind()),
                Reply::Stored(stored) => (
                    true,
                    stored.into_pyobject(py)?.to_owned().into_any().unbind(),
                ),
                Reply::Begun(attempt, tx) => {
                    let begun = Begun {
                        wake: self.wake.clone(),
                        attempt,
                        outcome: Mutex::new(Some(tx)),
                        call: Mutex::new(None),
                    };
                    (true, Py::new(py, begun)?.into_any())
                }
                Reply::Unencodable(reason) => (
                    false,
                    raise(py, "ResultUnavailable", (reason,))
                        .into_value(py)
                        .into_any(),
                ),
                Reply::Error(e) => (false, error_to_py(py, e).into_value(py).into_any()),
            };
            out.push((id, ok, value));
        }
        Ok(out)
    }
}

/// A call at its action: the caller runs the action, then completes or fails it.
#[pyclass(frozen, module = "idemkit._native")]
#[derive(Debug)]
struct Begun {
    wake: Arc<Wake>,
    attempt: Attempt,
    outcome: Mutex<Option<oneshot::Sender<(Handed, u64)>>>,
    call: Mutex<Option<JoinHandle<()>>>,
}

impl Begun {
    fn finish(&self, id: u64, outcome: Handed) -> PyResult<()> {
        let sender = self.outcome.lock().expect("not poisoned").take();
        let Some(sender) = sender else {
            return Err(PyRuntimeError::new_err("this call already has its outcome"));
        };
        // From here the call runs to its end on its own: nothing aborts it any more.
        self.call.lock().expect("not poisoned").take();
        if sender.send((outcome, id)).is_err() {
            self.wake.push(id, Reply::Stored(false));
        }
        Ok(())
    }
}

#[pymethods]
impl Begun {
    /// The attempt the action runs under (its fencing token, downstream key, lease).
    #[getter]
    fn attempt(&self) -> PyAttempt {
        PyAttempt {
            inner: self.attempt.clone(),
        }
    }

    /// The action returned: stores its encoded result; the bridge replies under `id`
    /// whether it was stored.
    fn complete(&self, id: u64, result: Vec<u8>) -> PyResult<()> {
        self.finish(id, Some(Encoded::Bytes(result)))
    }

    /// The action returned a value the codec could not encode: the key stays completed as
    /// "result unavailable" (the effect happened), so no retry runs the action again.
    fn unencodable(&self, id: u64, reason: String) -> PyResult<()> {
        self.finish(id, Some(Encoded::Unencodable(reason)))
    }

    /// The action raised: releases the key so a retry runs it again; the bridge replies
    /// under `id` once it is released.
    fn fail(&self, id: u64) -> PyResult<()> {
        self.finish(id, None)
    }

    /// The caller was cancelled while the action ran: the call is dropped at its action,
    /// and the reservation expires with its lease (as after a crash).
    fn cancel(&self) {
        if let Some(call) = self.call.lock().expect("not poisoned").take() {
            call.abort();
        }
    }
}

impl Drop for Begun {
    fn drop(&mut self) {
        if let Some(call) = self.call.get_mut().ok().and_then(Option::take) {
            call.abort();
        }
    }
}

/// What the action knows of its call: `fencing_token`, `downstream_key`, the lease.
#[pyclass(frozen, name = "Attempt", module = "idemkit._native")]
#[derive(Debug)]
struct PyAttempt {
    inner: Attempt,
}

#[pymethods]
impl PyAttempt {
    /// The reservation's fencing token (grows with every new owner), `None` unprotected.
    #[getter]
    fn fencing_token(&self) -> Option<u64> {
        self.inner.fencing_token().map(|t| t.get())
    }

    /// The key to pass downstream (an `Idempotency-Key` to a payment API), `None`
    /// unprotected: the same for every attempt of this call's key.
    #[getter]
    fn downstream_key(&self) -> Option<String> {
        self.inner.downstream_key().map(|k| k.into_string())
    }

    /// Whether the action runs under a reservation (false in `in_flight="run"` overlap, or
    /// a fail-open call with the store down).
    #[getter]
    fn is_protected(&self) -> bool {
        self.inner.is_protected()
    }

    /// Whether the lease was lost (renewals failed past its end): another caller may run.
    fn is_lease_lost(&self) -> bool {
        self.inner.is_lease_lost()
    }

    /// Seconds left on the lease, `None` unprotected.
    fn lease_left(&self) -> Option<f64> {
        self.inner.lease_left().map(|d| d.as_secs_f64())
    }

    fn __repr__(&self) -> String {
        format!(
            "<idemkit Attempt fencing_token={:?} protected={}>",
            self.fencing_token(),
            self.is_protected()
        )
    }
}

/// Migrates the transactional inbox's table (`schema.table`) on the database at `url`: the
/// same table and the same claim as the Rust crate's `Inbox`, so a message claimed by either
/// language is a duplicate to the other.
#[pyfunction]
#[pyo3(signature = (url, schema, table))]
fn migrate_inbox(
    py: Python<'_>,
    url: String,
    schema: String,
    table: String,
) -> PyResult<Bound<'_, PyAny>> {
    let inbox = idemkit_postgres::Inbox::new()
        .schema(&schema)
        .and_then(|i| i.table(&table))
        .map_err(|e| raise(py, "InvalidKey", (e.to_string(),)))?;
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let py_err = |e| Python::attach(|py| store_error_to_py(py, e));
        let pool = idemkit_postgres::sqlx::PgPool::connect(&url)
            .await
            .map_err(|e| {
                Python::attach(|py| {
                    raise(
                        py,
                        "StoreUnavailable",
                        (e.to_string(), "connect", "Unavailable"),
                    )
                })
            })?;
        inbox.migrate(&pool).await.map_err(py_err)?;
        pool.close().await;
        Ok(())
    })
}

/// Checks an operation (or consumer) name and a key (or message id) by the core's rules;
/// raises `InvalidKey`.
#[pyfunction]
fn validate(py: Python<'_>, operation: &str, key: &str) -> PyResult<()> {
    let invalid = |e: idemkit_core::KeyError| raise(py, "InvalidKey", (e.to_string(),));
    Operation::new(operation).map_err(invalid)?;
    Key::new(key).map_err(invalid)?;
    Ok(())
}

/// The module `idemkit._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Store>()?;
    m.add_class::<Coordinator>()?;
    m.add_class::<Begun>()?;
    m.add_class::<Bridge>()?;
    m.add_class::<Pending>()?;
    m.add_class::<PyAttempt>()?;
    m.add_function(wrap_pyfunction!(memory_store, m)?)?;
    m.add_function(wrap_pyfunction!(redis_store, m)?)?;
    m.add_function(wrap_pyfunction!(redis_cluster_store, m)?)?;
    m.add_function(wrap_pyfunction!(postgres_store, m)?)?;
    m.add_function(wrap_pyfunction!(migrate_inbox, m)?)?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    Ok(())
}
