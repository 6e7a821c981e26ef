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
//! The runtime's threads do not take the GIL to reply: a reply is queued as a Rust value and
//! the event loop is woken through a socket it watches (`Bridge`: one byte per batch of
//! replies), and Python objects are made on the loop's thread when it drains the queue. Connecting a store
//! replies the same way: nothing here depends on another crate's runtime or event-loop glue.
//!
//! # No caller waits for ever
//!
//! Every task that owes Python a reply carries a guard that, if the task ends without its
//! reply and nobody aborted it (a panic), replies an error instead. A call waiting for its
//! action's outcome watches its event loop: a loop that is closed or gone cannot deliver one,
//! and the call ends as a cancelled one does (`on_cancel`). The runtime is this process's:
//! a child after `fork()` starts its own on first use, and refuses stores connected by its
//! parent (their connections' tasks did not survive the fork).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idemkit_core::{
    Attempt, DynStore, Error, Fingerprint, InFlight, Key, OnCancel, OnStoreError, Operation,
    Policy, Scope, StoreErrorKind,
};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

mod bridge;
mod http;
mod stores;

use bridge::{Bridge, Reply, Wake, loop_closed};
use stores::{
    _panicking_store, Store, memory_store, migrate_inbox, postgres_store, redis_cluster_store,
    redis_store,
};

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
            attempt,
            holder,
            ..
        } => raise(
            py,
            "InProgress",
            (
                message,
                retry_after.as_secs_f64(),
                lease_left.as_secs_f64(),
                held_for.map(|d| d.as_secs_f64()),
                attempt.map(|a| a.get()),
                holder.map(|h| (h.host.clone(), h.pid, h.name.clone())),
            ),
        ),
        Error::KeyReused => raise(py, "KeyReused", (message,)),
        Error::ResultUnavailable { reason } => raise(py, "ResultUnavailable", (reason,)),
        Error::Decode(source) => raise(py, "DecodeError", (source.to_string(),)),
        Error::Store { phase, source } => raise(
            py,
            "_store_error",
            (
                source.kind() == StoreErrorKind::Unavailable,
                message,
                phase.to_string(),
                format!("{:?}", source.kind()),
            ),
        ),
        // The action's failure: Python holds the exception and raises it itself.
        Error::Action(ActionFailed) => raise(py, "IdemkitError", ("the action failed",)),
        other => raise(py, "IdemkitError", (other.to_string(),)),
    }
}

fn store_error_to_py(py: Python<'_>, e: idemkit_core::StoreError) -> PyErr {
    raise(
        py,
        "_store_error",
        (
            e.kind() == StoreErrorKind::Unavailable,
            e.to_string(),
            "connect",
            format!("{:?}", e.kind()),
        ),
    )
}

/// The runtime every call runs on, started on first use by this process: a child after
/// `fork()` has none of its parent's threads, so it starts its own (the parent's is left
/// alone: dropping it would wait for threads that do not exist here), and its tasks draw
/// owner tokens from fresh per-thread generators.
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    Ok(process_runtime()?.0)
}

/// A call's task, handed to the runtime's dispatcher instead of spawned by the caller: the
/// dispatcher spawns it from a worker thread, where a spawn is a push on the worker's own
/// queue. A caller that spawned it would wake a parked worker (a futex call) for every call;
/// the dispatcher's channel wakes it once for all the calls queued meanwhile, as the replies
/// wake the event loop once per batch.
struct Dispatch {
    call: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Where the spawned task's handle goes; `None` left there, and `task.aborted` set, by a
    /// caller that stopped waiting before the dispatcher got to it: then it is not spawned.
    handle: Arc<Mutex<Option<JoinHandle<()>>>>,
    task: Arc<TaskState>,
}

fn dispatch(job: Dispatch) -> PyResult<()> {
    process_runtime()?
        .1
        .send(job)
        .map_err(|_| PyRuntimeError::new_err("idemkit's runtime has stopped"))
}

type Runtime = (
    &'static tokio::runtime::Runtime,
    &'static tokio::sync::mpsc::UnboundedSender<Dispatch>,
);

fn process_runtime() -> PyResult<Runtime> {
    static CURRENT: Mutex<Option<(u32, Runtime)>> = Mutex::new(None);
    let pid = std::process::id();
    // Only callers holding the GIL take this lock, so no thread holds it across a fork.
    let mut current = CURRENT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((owner, rt)) = *current
        && owner == pid
    {
        return Ok(rt);
    }
    // One core is the event loop's (the GIL lets one Python thread run at a time): the
    // runtime's workers take the others, up to four (a call is mostly waiting on the store).
    // On two cores, a second worker costs CPU in futex wake-ups between the workers and the
    // loop for no more throughput (docs/python.md has the figures).
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.saturating_sub(1).clamp(1, 4))
        .enable_all()
        .thread_name("idemkit")
        .build()
        .map_err(|e| {
            PyRuntimeError::new_err(format!("idemkit could not start its runtime: {e}"))
        })?;
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(rt));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Dispatch>();
    rt.spawn(async move {
        while let Some(job) = rx.recv().await {
            let mut handle = job.handle.lock().expect("not poisoned");
            if !job.task.aborted.load(Ordering::Acquire) {
                *handle = Some(tokio::spawn(job.call));
            }
        }
    });
    let runtime = (rt, &*Box::leak(Box::new(tx)));
    *current = Some((pid, runtime));
    Ok(runtime)
}

/// How often a bridge's watchdog checks that its event loop can still hear the outcomes of
/// the actions running (only while one runs longer than this: `bridge::loop_closed`).
const LOOP_CHECK: Duration = Duration::from_secs(1);

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

fn on_cancel_of(mode: &str) -> PyResult<OnCancel> {
    match mode {
        "keep" => Ok(OnCancel::KeepLease),
        "release" => Ok(OnCancel::Release),
        other => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "on_cancel must be 'keep' or 'release', got {other:?}"
        ))),
    }
}

/// How many times the bridges' watchdogs checked their event loops in this process: the
/// tests' way to see that one watchdog serves every action of a loop (review L8).
#[pyfunction]
fn _loop_checks() -> u64 {
    bridge::LOOP_CHECKS.load(Ordering::Relaxed)
}

/// The coordinator: one per process and store, shared by every task.
#[pyclass(frozen, module = "idemkit._native")]
#[derive(Debug)]
struct Coordinator {
    inner: idemkit_core::Coordinator<DynStore>,
    store_pid: Option<u32>,
    store_name: &'static str,
}

#[pymethods]
impl Coordinator {
    #[new]
    #[pyo3(signature = (store, *, lease=None, wait_timeout=None, fail_open=false, holder_name=None, on_cancel="keep", max_result_bytes=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        store: &Store,
        lease: Option<f64>,
        wait_timeout: Option<f64>,
        fail_open: bool,
        holder_name: Option<String>,
        on_cancel: &str,
        max_result_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let mut policy = Policy::default().on_cancel(on_cancel_of(on_cancel)?);
        if let Some(max) = max_result_bytes {
            policy = policy.max_result_bytes(max);
        }
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
            store_pid: store.pid,
            store_name: store.name,
        })
    }

    /// How long the ASGI middleware lets one streamed frame wait for its client, in seconds:
    /// the Rust HTTP layer's rule (`idemkit_http::binding::client_pace`) on `operation`'s
    /// lease.
    fn client_pace(&self, py: Python<'_>, operation: &str) -> PyResult<f64> {
        let operation =
            Operation::new(operation).map_err(|e| raise(py, "InvalidKey", (e.to_string(),)))?;
        let lease = self.inner.policy_for(&operation).lease;
        Ok(idemkit_http::binding::client_pace(lease).as_secs_f64())
    }

    /// The largest stored result of `operation`'s calls, in bytes (`Policy::max_result_bytes`):
    /// the ASGI middleware stores no larger response, so the core never turns one into an
    /// unavailable result (review L5 of `e047556`).
    fn result_limit(&self, py: Python<'_>, operation: &str) -> PyResult<usize> {
        let operation =
            Operation::new(operation).map_err(|e| raise(py, "InvalidKey", (e.to_string(),)))?;
        Ok(self.inner.policy_for(&operation).max_result_bytes)
    }

    /// Starts a call on the runtime and returns at once: `bridge` gets the call's first
    /// reply under `id` (the stored result's bytes, a [`Begun`] whose action the caller runs
    /// now, or the call's error). The returned [`Pending`] aborts the call if the caller
    /// stops waiting. `on_cancel` (`"keep"` or `"release"`) overrides the coordinator's for
    /// this call.
    /// `exact_fingerprint` says `fingerprint` is a fingerprint's 16 bytes already (the ASGI
    /// middleware's, computed as the Rust HTTP layer does), not bytes to hash.
    #[pyo3(signature = (bridge, id, operation, key, ttl, in_flight="wait", fingerprint=None, scope=None, on_cancel=None, exact_fingerprint=false))]
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
        on_cancel: Option<&str>,
        exact_fingerprint: bool,
    ) -> PyResult<Pending> {
        if let Some(pid) = self.store_pid
            && pid != std::process::id()
        {
            let what = if self.store_name == "MemoryStore" {
                format!(
                    "this MemoryStore was made by process {pid}, before fork(): its records \
                     and locks stayed there; make a MemoryStore (and a coordinator) in this \
                     process"
                )
            } else {
                format!(
                    "this store was connected by process {pid}, before fork(): its connections \
                     stayed there; connect a store (and make a coordinator) in this process"
                )
            };
            return Err(raise(py, "ConfigError", (what,)));
        }
        let invalid = |e: idemkit_core::KeyError| raise(py, "InvalidKey", (e.to_string(),));
        let operation = Operation::new(operation).map_err(invalid)?;
        let key = Key::new(key).map_err(invalid)?;
        let scope = scope.map(Scope::new).transpose().map_err(invalid)?;
        let ttl = seconds("ttl", ttl)?;
        let mode = in_flight_of(in_flight)?;
        let policy = match on_cancel {
            Some(mode) => Some(
                self.inner
                    .policy_for(&operation)
                    .on_cancel(on_cancel_of(mode)?),
            ),
            None => None,
        };
        let fingerprint = match fingerprint {
            Some(exact) if exact_fingerprint => {
                Some(Fingerprint::from_bytes(exact.try_into().map_err(|_| {
                    pyo3::exceptions::PyValueError::new_err("an exact fingerprint is 16 bytes")
                })?))
            }
            other => other.map(Fingerprint::of),
        };

        let coordinator = self.inner.clone();
        let task = Arc::new(TaskState::new(bridge.wake.clone(), id));
        let shared = task.clone();
        let call = Box::pin(async move {
            let guard = Unreplied(shared);
            let task = &guard.0;
            let mut call = coordinator
                .call_owned(operation, key)
                .scope_owned(scope)
                .ttl(ttl)
                .in_flight(mode)
                .fingerprint(fingerprint);
            if let Some(policy) = policy {
                call = call.policy(policy);
            }
            let call = call.codec(Handoff).run(|attempt| {
                let (tx, rx) = oneshot::channel::<(Handed, u64)>();
                // From here a caller that stops waiting does not abort the call: the
                // `Begun` below reaches the loop, which releases it (nothing ran).
                let handed_over = task
                    .phase
                    .compare_exchange(BEGINNING, AT_ACTION, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok();
                if handed_over {
                    task.wake.push(id, Reply::Begun(attempt, tx, task.clone()));
                }
                async move {
                    if !handed_over {
                        return Err(ActionFailed);
                    }
                    let handed = tokio::select! {
                        handed = rx => handed.ok(),
                        () = loop_closed(&task.wake) => None,
                    };
                    match handed {
                        Some((handed, completion)) => {
                            task.reply_to.store(completion, Ordering::Release);
                            handed.ok_or(ActionFailed)
                        }
                        // Python never saw this call's action (its loop closed before it
                        // drained the reply): nothing ran, so the key is released.
                        None if !task.delivered.load(Ordering::Acquire) => Err(ActionFailed),
                        // The action was running when its loop closed (or its `Begun` went
                        // away): no outcome can come. The call is dropped at its action, as
                        // a cancelled one is, and its policy's `on_cancel` applies.
                        None => {
                            task.abandoned.notify_one();
                            std::future::pending().await
                        }
                    }
                }
            });
            let outcome = tokio::select! {
                outcome = call => outcome,
                () = task.abandoned.notified() => {
                    task.aborted.store(true, Ordering::Release);
                    return;
                }
            };
            let reply_to = task.reply_to.load(Ordering::Acquire);
            let reply = match outcome {
                Ok(receipt) if reply_to == id => match receipt.into_value() {
                    Encoded::Bytes(bytes) => Reply::Replay(bytes),
                    Encoded::Unencodable(reason) => Reply::Unencodable(reason),
                },
                Ok(receipt) => Reply::Stored(receipt.stored),
                Err(Error::Action(ActionFailed)) => Reply::Stored(false),
                Err(e) => Reply::Error(e),
            };
            task.reply(reply);
        });
        let handle = Arc::new(Mutex::new(None));
        dispatch(Dispatch {
            call,
            handle: handle.clone(),
            task: task.clone(),
        })?;
        Ok(Pending { call: handle, task })
    }
}

/// What a task that owes Python a reply shares with the Python objects that may end it.
#[derive(Debug)]
struct TaskState {
    wake: Arc<Wake>,
    /// The id the task's last reply goes under: the begin's, until the action hands over
    /// its outcome with the id its completion waits under.
    reply_to: AtomicU64,
    /// Set before the task is aborted on purpose (a cancelled caller): no reply is owed.
    aborted: AtomicBool,
    /// Set once its reply is queued.
    replied: AtomicBool,
    /// Set when Python received the `Begun`: its action may have started.
    delivered: AtomicBool,
    /// Notified when the running action can never hand its outcome over.
    abandoned: Notify,
    /// [`BEGINNING`], [`AT_ACTION`] or [`ABORTED`]: whether a caller that stops waiting
    /// before its first reply aborts the call (before the action) or leaves the `Begun` it
    /// will not take to the loop, which releases it.
    phase: AtomicU8,
}

const BEGINNING: u8 = 0;
const AT_ACTION: u8 = 1;
const ABORTED: u8 = 2;

impl TaskState {
    fn new(wake: Arc<Wake>, id: u64) -> Self {
        TaskState {
            wake,
            reply_to: AtomicU64::new(id),
            aborted: AtomicBool::new(false),
            replied: AtomicBool::new(false),
            delivered: AtomicBool::new(false),
            abandoned: Notify::new(),
            phase: AtomicU8::new(BEGINNING),
        }
    }

    fn reply(&self, reply: Reply) {
        self.replied.store(true, Ordering::Release);
        self.wake.push(self.reply_to.load(Ordering::Acquire), reply);
    }
}

/// Dropped with its task: a task that ends without its reply, and that nobody aborted,
/// panicked. Its caller gets an error instead of waiting for ever. (Tokio drops a panicked
/// task's future after catching the panic, so `thread::panicking` cannot tell.)
struct Unreplied(Arc<TaskState>);

impl Drop for Unreplied {
    fn drop(&mut self) {
        let task = &self.0;
        if !task.replied.load(Ordering::Acquire) && !task.aborted.load(Ordering::Acquire) {
            task.reply(Reply::Panicked);
        }
    }
}

/// The call a [`Coordinator::begin`] started, until its first reply.
#[pyclass(frozen, module = "idemkit._native")]
#[derive(Debug)]
struct Pending {
    /// The call's task, once the dispatcher has spawned it.
    call: Arc<Mutex<Option<JoinHandle<()>>>>,
    task: Arc<TaskState>,
}

#[pymethods]
impl Pending {
    /// The caller stopped waiting (cancelled, or its coroutine closed) before its first
    /// reply: a call still beginning is dropped where it is; one that reached its action has
    /// sent its `Begun` already (or is sending it), which the caller's bridge releases
    /// (`Begun.fail`) on finding nobody waiting for it. `False` in that second case: a
    /// blocking caller, whose bridge nobody else drains, then takes the `Begun` to release it.
    fn abort(&self) -> bool {
        let task = &self.task;
        match task
            .phase
            .compare_exchange(BEGINNING, ABORTED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {}
            Err(ABORTED) => return true,
            Err(_) => return false,
        }
        // Under the handle's lock, which the dispatcher holds while it spawns: a task not
        // spawned yet never will be, one spawned is aborted.
        let mut call = self.call.lock().expect("not poisoned");
        task.aborted.store(true, Ordering::Release);
        if let Some(call) = call.take() {
            call.abort();
        }
        true
    }

    /// The call reached its action: the [`Begun`] owns it from now on.
    fn hand_over(&self, begun: &Begun) {
        let call = self.call.lock().expect("not poisoned").take();
        *begun.call.lock().expect("not poisoned") = call;
    }
}

/// A call at its action: the caller runs the action, then completes or fails it.
#[pyclass(frozen, module = "idemkit._native")]
#[derive(Debug)]
struct Begun {
    attempt: Attempt,
    outcome: Mutex<Option<oneshot::Sender<(Handed, u64)>>>,
    call: Mutex<Option<JoinHandle<()>>>,
    task: Arc<TaskState>,
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
            // The call's task is gone without taking the outcome: it panicked.
            self.task.wake.push(id, Reply::Panicked);
        }
        Ok(())
    }

    fn abort(&self) {
        if let Some(call) = self.call.lock().expect("not poisoned").take() {
            self.task.aborted.store(true, Ordering::Release);
            call.abort();
        }
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

    /// The action did not finish (its task cancelled, `KeyboardInterrupt`, `SystemExit`,
    /// its coroutine closed): the call is dropped at its action, and the call's `on_cancel`
    /// decides (keep the reservation until its lease ends, as a crash does, or release it).
    fn cancel(&self) {
        self.abort();
    }
}

impl Drop for Begun {
    fn drop(&mut self) {
        self.abort();
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
    m.add_function(wrap_pyfunction!(_panicking_store, m)?)?;
    m.add_function(wrap_pyfunction!(_loop_checks, m)?)?;
    http::register(m)?;
    Ok(())
}
