//! `shmbroker._shmbroker`: the native half of the `shmbroker` Python package, a thin layer over
//! [`shmbroker::Session`] that makes the same choices as the C ABI (`capi/src/lib.rs`).
//!
//! # Rules every method keeps
//!
//! - A library error becomes the Python exception `errors` chooses for it, with the library's
//!   message (which names the rank). No Rust panic is left uncaught (PyO3 turns one into
//!   `pyo3_runtime.PanicException`, after which the session refuses every call but `close`).
//! - Every call that can wait goes through [`PySession::call`], which releases the GIL for
//!   its waits and lets Ctrl-C end them (see the `sigint` module): the call then raises what
//!   Python's SIGINT handler raises, `KeyboardInterrupt` unless the program changed it. It
//!   raises only before it has taken anything: a call that took a message returns it, Python
//!   objects made, and the next call raises.
//! - Every call has a deadline: the one given to `connect`, or its own `timeout=`.
//! - A closed session, a session another thread is in a call on, and a forked child's copy of a
//!   session raise `shmbroker.Error`; nothing crashes.
//!
//! A session is used by one thread at a time (as in the C ABI); a second thread calling in while
//! one waits is told so at once instead of blocking behind it.

mod args;
mod buffer;
mod channels;
mod errors;
mod group;
mod loans;
mod logs;
mod process;
mod session;
mod sigint;
mod split;

pub(crate) use args::{CallTimeout, deadline_arg, rank_arg};
use group::PyGroup;
use pyo3::prelude::*;
pub(crate) use session::PySession;
use shmbroker::Session;
use shmbroker::launch::Launch;
use std::path::PathBuf;

/// Logs on and returns the :class:`Session`.
///
/// With ``path=None``, joins the job this process was started in: ``shmbroker run``, or
/// mpirun, torchrun or srun (``SHMBROKER_SOCKET``, ``SHMBROKER_RANK``,
/// ``SHMBROKER_WORLD_SIZE``, or the launcher's own variables); the environment then gives the
/// rank, so ``rank`` must be left out. With a ``path``, logs on to the broker listening there as
/// ``rank`` (``None``: any free rank).
///
/// With a ``path`` and a ``world_size``, starts a job of its own there, with no launcher: rank
/// 0 hosts the broker on ``path`` for as long as its session lives, and every rank (each gives
/// its ``rank``) logs on, retrying while the broker comes up. The ranks agree on ``path`` by
/// other means (the torch.distributed backend uses torch's store).
///
/// ``timeout`` (seconds, above 0) bounds the logon, and is every later call's deadline unless
/// the call is given its own; ``None`` waits without a deadline (deaths and departures still end
/// a wait).
///
/// Nothing is sent to a broker that runs as another user than this process's (or root), and
/// a launcher's socket lies in a directory private to this user (``shmbroker-<uid>`` under
/// ``$XDG_RUNTIME_DIR`` or the temp dir), checked before use.
///
/// Raises :class:`LogonError` when no broker answers in time, the broker refuses, the broker
/// runs as another user (``SHMBROKER_BROKER_UID`` trusts one more uid), the socket's directory
/// is not private, or the environment does not say where this process stands;
/// :class:`MisuseError` for a bad argument.
#[pyfunction]
#[pyo3(
    signature = (path=None, rank=None, timeout=Some(10.0), *, world_size=None),
    text_signature = "(path=None, rank=None, timeout=10.0, *, world_size=None)"
)]
fn connect(
    py: Python<'_>,
    path: Option<PathBuf>,
    rank: Option<i64>,
    timeout: Option<f64>,
    world_size: Option<i64>,
) -> PyResult<PySession> {
    let timeout = deadline_arg(timeout)?;
    let rank = rank.map(rank_arg).transpose()?;
    let session = match (path, rank, world_size) {
        (Some(socket), Some(rank), Some(size)) => {
            let world_size = u32::try_from(size)
                .ok()
                .filter(|&size| size > 0 && rank < size)
                .ok_or_else(|| {
                    errors::misuse(format!(
                        "world_size {size} must be above rank {rank} (and fit 32 bits)"
                    ))
                })?;
            let launch = Launch {
                rank,
                world_size,
                socket,
                source: "shmbroker.connect(path, rank, world_size=...)".into(),
                external_broker: false,
                private_dir: None,
            };
            py.detach(|| Session::from_launch(&launch, timeout))
        }
        (_, _, Some(size)) => {
            return Err(errors::misuse(format!(
                "world_size {size} starts a job of its own, which needs both a path and a rank"
            )));
        }
        (None, Some(rank), None) => {
            return Err(errors::misuse(format!(
                "rank {rank} without a path: with path=None the environment gives the rank \
                 (set SHMBROKER_RANK to choose it)"
            )));
        }
        (None, None, None) => py.detach(|| Session::from_env(timeout)),
        (Some(path), rank, None) => py.detach(|| Session::connect(path, rank, timeout)),
    };
    let mut session = session.map_err(errors::to_py)?;
    session.set_timeout(timeout);
    Ok(PySession::new(session, timeout))
}

/// What every rank of the job served at `socket` is doing, asked of its broker within
/// `timeout` seconds: the lines of `shmbroker status --json` (`shmbroker.status` parses them).
#[pyfunction]
fn _status_json(py: Python<'_>, socket: PathBuf, timeout: f64) -> PyResult<String> {
    let timeout = args::seconds(timeout)?;
    let report = py
        .detach(|| shmbroker::status::query(&socket, timeout))
        .map_err(|error| errors::to_py(shmbroker::session::Error::Logon(error)))?;
    Ok(shmbroker::status::json_lines(&report))
}

/// The native module; the `shmbroker` package re-exports it.
#[pymodule]
fn _shmbroker(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add(
        "MAX_FDS_PER_EXCHANGE",
        shmbroker::session::MAX_FDS_PER_EXCHANGE,
    )?;
    module.add_class::<PySession>()?;
    module.add_class::<PyGroup>()?;
    module.add_class::<split::PySender>()?;
    module.add_class::<channels::PyChannelSender>()?;
    module.add_class::<channels::PyChannelReceiver>()?;
    module.add_class::<split::PyReceiver>()?;
    module.add_class::<loans::PyLoan>()?;
    module.add_class::<loans::PyLoanView>()?;
    module.add_function(wrap_pyfunction!(connect, module)?)?;
    module.add_function(wrap_pyfunction!(logs::_forward_logs, module)?)?;
    module.add_function(wrap_pyfunction!(_status_json, module)?)?;
    Ok(())
}
