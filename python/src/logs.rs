//! The library's log events into Python's `logging` (the logger `shmbroker`, see
//! `shmbroker/_logs.py`).
//!
//! An event can be logged on any thread: the caller's, a session's watcher thread, or a thread
//! of a broker this process hosts. Calling Python there would need the GIL, and a thread that
//! holds the GIL may be waiting for that very thread (a `Session` freed by the garbage collector
//! stops the broker it hosts and joins its threads), so the sink only queues the event, bounded,
//! and one forwarding thread of its own hands each to Python with the GIL. Nothing waits for the
//! forwarding thread. Events therefore reach `logging` shortly after they happen, in order.

use pyo3::prelude::*;
use shmbroker::logging::{Level, set_sink};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TrySendError, sync_channel};

/// Events queued for Python at most; past this, events are counted and dropped until there is
/// room, and the count is logged with the next one.
const QUEUED: usize = 1024;

/// Events dropped because the queue was full.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Sends the library's events, `DEBUG` and more severe, to `forward(levelno, target, message)`
/// (Python `logging` level numbers), called on a thread of this module's own with the GIL.
/// Called once, by `shmbroker/_logs.py` at import.
#[pyfunction]
pub fn _forward_logs(forward: Py<PyAny>) -> PyResult<()> {
    let (queue, events) = sync_channel::<(Level, String, String)>(QUEUED);
    std::thread::Builder::new()
        .name("shmbroker-logs".into())
        .spawn(move || forward_all(&events, &forward))
        .map_err(|error| pyo3::exceptions::PyOSError::new_err(error.to_string()))?;
    let sink = Box::new(move |level, target: &str, message: &str| {
        match queue.try_send((level, target.to_owned(), message.to_owned())) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    // A process that already has a tracing subscriber keeps it: its events go there.
    let _ = set_sink(Level::Debug, Some(sink));
    Ok(())
}

/// The forwarding thread: each event to Python until the interpreter is going away.
fn forward_all(events: &Receiver<(Level, String, String)>, forward: &Py<PyAny>) {
    while let Ok((level, target, mut message)) = events.recv() {
        let dropped = DROPPED.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            message.push_str(&format!(
                " ({dropped} earlier events were dropped: Python did not take them in time)"
            ));
        }
        let levelno = match level {
            Level::Error => 40,
            Level::Warn => 30,
            Level::Info => 20,
            Level::Debug => 10,
            Level::Trace => 5,
        };
        let delivered = Python::try_attach(|py| {
            if let Err(error) = forward.call1(py, (levelno, target, message)) {
                // A handler that raises: Python's own way of reporting it, and go on.
                error.write_unraisable(py, None);
            }
        });
        if delivered.is_none() {
            // The interpreter is shutting down: nobody is left to log to.
            return;
        }
    }
}
