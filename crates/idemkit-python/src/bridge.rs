//! How the runtime's replies reach the event loop (or a blocking caller's thread) without
//! the GIL: queued as Rust values, one byte on a socket per batch.

use super::*;

/// A reply of the runtime to the event loop, made a Python value only there (the runtime's
/// threads do not take the GIL to reply).
pub(crate) enum Reply {
    Replay(Vec<u8>),
    Unencodable(String),
    Begun(Attempt, oneshot::Sender<(Handed, u64)>, Arc<TaskState>),
    Stored(bool),
    Error(Error<ActionFailed>),
    Connected(Store),
    Failed(idemkit_core::StoreError),
    /// The task owing this reply panicked (a bug in idemkit: the message is in stderr).
    Panicked,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reply::Replay(_) => "Replay",
            Reply::Unencodable(_) => "Unencodable",
            Reply::Begun(..) => "Begun",
            Reply::Stored(_) => "Stored",
            Reply::Error(_) => "Error",
            Reply::Connected(_) => "Connected",
            Reply::Failed(_) => "Failed",
            Reply::Panicked => "Panicked",
        })
    }
}

/// The replies waiting for the event loop, and the socket that wakes it: one byte per batch
/// of replies (`signalled` is set by the push that finds the batch empty, cleared by the
/// drain that takes it), so a loop under load is woken once for many calls.
#[derive(Debug)]
pub(crate) struct Wake {
    pub(crate) replies: Mutex<Vec<(u64, Reply)>>,
    pub(crate) signalled: AtomicBool,
    pub(crate) tx: UnixStream,
    /// A weak reference to the event loop that drains the replies (`None`: not watched).
    pub(crate) event_loop: Option<Arc<Py<PyAny>>>,
    /// Whether that loop is closed, as one watchdog of this bridge finds (`loop_closed`).
    pub(crate) watch: LoopWatch,
}

/// The one watchdog of a bridge's event loop (review L8 of `e047556`: each running action
/// had its own, so 2,000 long actions took the GIL 2,000 times a second). It runs while an
/// action waits on it, checks the loop every [`LOOP_CHECK`], and ends when nobody waits.
#[derive(Debug, Default)]
pub(crate) struct LoopWatch {
    /// Actions waiting to hear that the loop closed.
    waiters: AtomicUsize,
    /// A watchdog task runs (or is about to).
    running: AtomicBool,
    /// The loop was found closed or gone: for good.
    closed: AtomicBool,
    notify: tokio::sync::Notify,
}

/// How many times a watchdog checked its loop, in this process (tests: `_loop_checks`).
pub(crate) static LOOP_CHECKS: AtomicU64 = AtomicU64::new(0);

/// Whether `wake`'s event loop is closed or gone: its bridge's one watchdog checks it every
/// [`LOOP_CHECK`] on a blocking thread (it takes the GIL), for all the actions waiting on
/// it; never returns for a bridge without a loop.
pub(crate) async fn loop_closed(wake: &Arc<Wake>) {
    if wake.event_loop.is_none() {
        return std::future::pending().await;
    }
    let watch = &wake.watch;
    watch.waiters.fetch_add(1, Ordering::SeqCst);
    struct Leaving<'a>(&'a AtomicUsize);
    impl Drop for Leaving<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let _leaving = Leaving(&watch.waiters);
    let notified = watch.notify.notified();
    tokio::pin!(notified);
    // Registered before the flag is read: a watchdog that finds the loop closed after this
    // read wakes this waiter.
    notified.as_mut().enable();
    if watch.closed.load(Ordering::SeqCst) {
        return;
    }
    if !watch.running.swap(true, Ordering::SeqCst) {
        tokio::spawn(watchdog(Arc::downgrade(wake)));
    }
    notified.await;
}

/// Checks the loop every [`LOOP_CHECK`] while actions wait on it; wakes them all once it is
/// closed. Holds the bridge weakly: a bridge dropped ends it.
async fn watchdog(wake: std::sync::Weak<Wake>) {
    loop {
        tokio::time::sleep(LOOP_CHECK).await;
        let Some(wake) = wake.upgrade() else { return };
        let watch = &wake.watch;
        if watch.waiters.load(Ordering::SeqCst) == 0 {
            // Nobody waits: end. A waiter that came after the read above and found this
            // watchdog still running is seen by the second read, and kept watched.
            watch.running.store(false, Ordering::SeqCst);
            if watch.waiters.load(Ordering::SeqCst) == 0
                || watch.running.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
        let Some(event_loop) = wake.event_loop.clone() else {
            return;
        };
        LOOP_CHECKS.fetch_add(1, Ordering::Relaxed);
        let closed = tokio::task::spawn_blocking(move || {
            // An interpreter that is shutting down runs no loop any more.
            Python::try_attach(|py| {
                let current = event_loop.bind(py).call0()?;
                PyResult::Ok(current.is_none() || current.call_method0("is_closed")?.is_truthy()?)
            })
            .is_none_or(|closed| closed.unwrap_or(false))
        })
        .await
        .unwrap_or(false);
        if closed {
            watch.closed.store(true, Ordering::SeqCst);
            watch.notify.notify_waiters();
            return;
        }
    }
}

impl Wake {
    pub(crate) fn push(&self, id: u64, reply: Reply) {
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
pub(crate) struct Bridge {
    pub(crate) wake: Arc<Wake>,
    pub(crate) rx: UnixStream,
}

#[pymethods]
impl Bridge {
    /// `event_loop_ref`: a `weakref.ref` to the loop that drains this bridge; a call whose
    /// action runs checks it, and ends as a cancelled call once the loop is closed or gone.
    #[new]
    #[pyo3(signature = (event_loop_ref=None))]
    pub(crate) fn new(event_loop_ref: Option<Py<PyAny>>) -> PyResult<Self> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok(Bridge {
            wake: Arc::new(Wake {
                replies: Mutex::new(Vec::new()),
                signalled: AtomicBool::new(false),
                tx,
                event_loop: event_loop_ref.map(Arc::new),
                watch: LoopWatch::default(),
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
                Reply::Begun(attempt, tx, task) => {
                    task.delivered.store(true, Ordering::Release);
                    let begun = Begun {
                        attempt,
                        outcome: Mutex::new(Some(tx)),
                        call: Mutex::new(None),
                        task,
                    };
                    (true, Py::new(py, begun)?.into_any())
                }
                Reply::Connected(store) => (true, Py::new(py, store)?.into_any()),
                Reply::Unencodable(reason) => (
                    false,
                    raise(py, "ResultUnavailable", (reason,))
                        .into_value(py)
                        .into_any(),
                ),
                Reply::Error(e) => (false, error_to_py(py, e).into_value(py).into_any()),
                Reply::Failed(e) => (false, store_error_to_py(py, e).into_value(py).into_any()),
                Reply::Panicked => (
                    false,
                    raise(
                        py,
                        "IdemkitError",
                        ("idemkit's runtime panicked while running this call (a bug: the panic's \
                          message is on stderr); its key is left to its lease",),
                    )
                    .into_value(py)
                    .into_any(),
                ),
            };
            out.push((id, ok, value));
        }
        Ok(out)
    }
}
