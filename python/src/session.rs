//! `shmbroker.Session`: the library session behind a lock, and its methods.

use crate::args::*;
use crate::buffer::Bytes;
use crate::group::PyGroup;
use crate::{channels, errors, loans, process, sigint, split};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use shmbroker::Collectives;
use shmbroker::session::{Group, Interrupter};
use shmbroker::{Error, Session};
use std::os::fd::{IntoRawFd, RawFd};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

/// Runs `$call` with `$c` the session `$session`, or its view through `$group` (an
/// `Option<&Group>`; `None` for the whole world): the methods share their names.
macro_rules! on_comm {
    ($session:expr, $group:expr, $timeout:expr, |$c:ident| $call:expr) => {
        match $group {
            None => {
                let mut timed = $session.with_timeout($timeout);
                let $c = &mut *timed;
                $call
            }
            Some(group) => {
                let mut view = $session.on(group).with_timeout($timeout);
                let $c = &mut view;
                $call
            }
        }
    };
}

/// A collective from one buffer into another: `$method(input, output, timeout)` on the session,
/// or on `$group` when one is given, with the GIL released.
macro_rules! in_to_out {
    ($self:ident, $py:ident, $input:ident, $output:ident, $timeout:ident, $group:ident, $method:ident) => {{
        let input = Bytes::get($input)?;
        let mut output = Bytes::get_mut($output)?;
        let timeout = $self.deadline($timeout)?;
        let group = $group.map(|group| group.group.clone());
        let (input, output) = (input.as_slice(), output.as_mut_slice());
        $self.blocking($py, |session| {
            on_comm!(session, group.as_ref(), timeout, |c| c
                .$method(input, output))
        })
    }};
}

/// What a `Session` object holds: the library session until it is closed, and the process that
/// made it.
#[derive(Debug)]
struct Slot {
    session: Option<Session>,
    /// The process the session belongs to. A forked child's copy of it must neither use it nor
    /// drop it: dropping closes the rings' ends (in memory shared with the parent) and tells the
    /// broker goodbye, which would make the parent's peers think the parent left.
    pid: u32,
}

impl Slot {
    fn forked(&self) -> bool {
        process::pid() != self.pid
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.forked()
            && let Some(session) = self.session.take()
        {
            // A fork's copy (see `pid`): its memory is freed with the child's process.
            std::mem::forget(session);
        }
    }
}

/// A worker's session, made by :func:`shmbroker.connect`: its rank, its links to every peer,
/// and the collectives over them.
///
/// Every call that waits releases the GIL, and has a deadline: the ``timeout`` given to
/// ``connect``, or the call's own ``timeout=`` (seconds; ``None`` for none, as a server waiting
/// for its next request wants: a peer's death or departure still ends the wait). Ctrl-C ends a
/// wait on the main thread with ``KeyboardInterrupt``; nothing is lost. A call raises it only
/// before it takes anything: a receive that took its message returns it, and the next call
/// raises. Data is anything with the buffer
/// protocol that is C-contiguous (``bytes``, ``bytearray``, ``memoryview``, ``array.array``,
/// NumPy arrays); it is read in place while the GIL is released, so no other thread may write to
/// it during the call. Received data is ``bytes``.
///
/// A session is used by one thread at a time: a call while another thread is in one raises
/// :class:`shmbroker.Error`. Use it as a context manager, or call :meth:`close`: a peer waiting on
/// this rank is then told it left (:class:`shmbroker.PeerLeft`) instead of that it died.
#[pyclass(module = "shmbroker", name = "Session", frozen)]
#[derive(Debug)]
pub(crate) struct PySession {
    rank: u32,
    world_size: u32,
    rejoins: u32,
    timeout: Duration,
    /// The process that made the session (as `Slot::pid`, readable without the lock).
    pid: u32,
    slot: Mutex<Slot>,
    /// Ends the session's waits on Ctrl-C (see the `sigint` module); made once, not per call.
    interrupter: Interrupter,
}

/// The session during one [`PySession::call`]: its waits.
struct Waits<'s> {
    session: &'s mut Session,
    /// Whether the call holds Ctrl-C back (see [`PySession::call`]).
    armed: bool,
    /// Whether a wait ended with [`Error::Interrupted`] (or the call stopped for a Ctrl-C).
    interrupted: bool,
}

impl Waits<'_> {
    /// Runs `call` on the session with the GIL released.
    fn wait<T: Send>(
        &mut self,
        py: Python<'_>,
        call: impl FnOnce(&mut Session) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        let session = &mut *self.session;
        py.detach(|| call(session))
            .map_err(|error| self.failed(error))
    }

    /// Stops the call, before it takes anything, if a Ctrl-C came since it began.
    fn stop_if_interrupted(&mut self) -> PyResult<()> {
        if self.armed && sigint::caught() {
            return Err(self.failed(Error::Interrupted));
        }
        Ok(())
    }

    fn failed(&mut self, error: Error) -> PyErr {
        self.interrupted |= matches!(error, Error::Interrupted);
        errors::to_py(error)
    }
}

impl PySession {
    pub(crate) fn new(session: Session, timeout: Duration) -> Self {
        Self {
            rank: session.rank(),
            world_size: session.world_size(),
            rejoins: session.rejoins(),
            timeout,
            pid: process::pid(),
            interrupter: session.interrupter(),
            slot: Mutex::new(Slot {
                session: Some(session),
                pid: process::pid(),
            }),
        }
    }

    /// Whether this process is a fork of the one that made the session.
    fn forked(&self) -> bool {
        process::pid() != self.pid
    }

    /// The slot, if no other thread is in a call and this is the process that made it.
    fn lock(&self) -> PyResult<MutexGuard<'_, Slot>> {
        let slot = match self.slot.try_lock() {
            Ok(slot) => slot,
            Err(TryLockError::WouldBlock) => {
                return Err(errors::plain(
                    "session is busy: another thread is in a call on it (a session is used by \
                     one thread at a time)",
                ));
            }
            Err(TryLockError::Poisoned(_)) => {
                return Err(errors::plain(
                    "session is unusable: a call on it panicked (a bug in shmbroker); close it",
                ));
            }
        };
        if slot.forked() {
            return Err(errors::plain(format!(
                "session belongs to process {}, of which this process is a fork; connect again \
                 in this process",
                slot.pid
            )));
        }
        Ok(slot)
    }

    /// Runs `body`, one call of the Python API that can wait, on the session: the one way
    /// every such call reaches the library. `body` waits through [`Waits::wait`], with the GIL
    /// released, and makes its Python result itself, before it returns.
    ///
    /// On the main thread, a Ctrl-C is held back for the whole call (see the `sigint` module),
    /// from before its first look for one to its return, and not only while it waits. So the
    /// call either raises `KeyboardInterrupt` before it takes anything off the rings, or
    /// returns what it took: a SIGINT that comes once the call took a message is kept for the
    /// next call. Python never sees it while it could still throw the result away.
    fn call<R>(
        &self,
        py: Python<'_>,
        body: impl FnOnce(&mut Waits<'_>) -> PyResult<R>,
    ) -> PyResult<R> {
        let mut slot = self.lock()?;
        let session = slot
            .session
            .as_mut()
            .ok_or_else(|| errors::plain("session is closed"))?;
        // An interrupt left over from a call that had ended before it came is dropped.
        session.clear_interrupt();
        // Python runs signal handlers on the main thread only, so only its calls are armed.
        let main = process::on_main_thread();
        let armed = main
            .then(|| sigint::Armed::arm(&self.interrupter))
            .flatten();
        let mut waits = Waits {
            session,
            armed: armed.is_some(),
            interrupted: false,
        };
        let result = Self::look_for_ctrl_c(py, main).and_then(|()| body(&mut waits));
        let caught = armed.is_some_and(sigint::Armed::disarm);
        sigint::settle(py, caught, waits.interrupted, result)
    }

    /// A call's first step, once armed: a Ctrl-C that came before it raises now, before the
    /// call does anything. That is one kept from an earlier call that succeeded (see the
    /// `sigint` module), or one that reached Python's handler between calls (Python would
    /// raise it as this call returned, and throw away what it took). A handler that raises
    /// nothing lets the call go on.
    fn look_for_ctrl_c(py: Python<'_>, main: bool) -> PyResult<()> {
        if !main {
            return Ok(());
        }
        if sigint::take_deferred() {
            sigint::deliver();
        }
        py.check_signals()
    }

    /// [`Self::call`] of a single wait, `call`, whose result PyO3 converts.
    fn blocking<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut Session) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        self.call(py, |waits| waits.wait(py, call))
    }

    /// [`Self::call`] of a single wait, `call`, whose result `then` makes into Python objects
    /// within the call (a `bytes` of a message, a list of fds, a view of a loan).
    fn blocking_then<T: Send, R>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut Session) -> Result<T, Error> + Send,
        then: impl FnOnce(T) -> PyResult<R>,
    ) -> PyResult<R> {
        self.call(py, |waits| then(waits.wait(py, call)?))
    }

    /// `call` for the library calls that take no deadline of their own: the session's deadline
    /// is `timeout` for the call, then its default again.
    fn within<T: Send>(
        &self,
        timeout: Duration,
        call: impl FnOnce(&mut Session) -> Result<T, Error> + Send,
    ) -> impl FnOnce(&mut Session) -> Result<T, Error> + Send {
        let default = self.timeout;
        move |session| {
            session.set_timeout(timeout);
            let result = call(session);
            session.set_timeout(default);
            result
        }
    }

    /// This rank's rank among the ranks a collective runs on: in `group`, or in the world.
    fn rank_in(&self, group: Option<&Group>) -> u32 {
        group.map_or(self.rank, Group::rank)
    }

    /// A call's `timeout=` as its deadline: the session's when left out.
    fn deadline(&self, timeout: CallTimeout) -> PyResult<Duration> {
        match timeout {
            CallTimeout::Session => Ok(self.timeout),
            CallTimeout::Given(secs) => deadline_arg(secs),
        }
    }
}

#[pymethods]
impl PySession {
    /// This worker's rank, from 0 to ``world_size - 1`` (still readable after :meth:`close`).
    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks in the session (still readable after :meth:`close`).
    #[getter]
    fn world_size(&self) -> u32 {
        self.world_size
    }

    /// How many processes held this rank before this one in the job: 0 for the job's first, more
    /// for a process that replaced one that died (it rejoined; its world's collectives are
    /// over: make a group).
    #[getter]
    fn rejoins(&self) -> u32 {
        self.rejoins
    }

    /// Whether this process replaced a rank that died (``rejoins > 0``).
    #[getter]
    fn rejoined(&self) -> bool {
        self.rejoins > 0
    }

    /// Waits until rank ``rank`` is there: at once if its process is alive; if it died, until a
    /// replacement rejoins the job, which this session then takes on. Messages with it work
    /// afterwards; make a new group for collectives.
    ///
    /// Raises :class:`Timeout` when no replacement came in time; :class:`PeerLeft` or
    /// :class:`PeerNeverJoined` for a rank nobody replaces; :class:`BrokerLost`.
    #[pyo3(signature = (rank, *, timeout=CallTimeout::Session))]
    fn wait_for_rank(&self, py: Python<'_>, rank: i64, timeout: CallTimeout) -> PyResult<()> {
        let rank = rank_arg(rank)?;
        let timeout = self.deadline(timeout)?;
        self.blocking(py, |session| {
            session.with_timeout(timeout).wait_for_rank(rank)
        })
    }

    /// The deadline, in seconds, of every call not given its own ``timeout=``; ``None`` when
    /// there is none (``connect(timeout=None)``).
    #[getter]
    fn timeout(&self) -> Option<f64> {
        (self.timeout != Duration::MAX).then_some(self.timeout.as_secs_f64())
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        // A busy session is in a call, so open; a poisoned one still holds its session.
        match self.slot.try_lock() {
            Ok(slot) => slot.session.is_none(),
            Err(TryLockError::WouldBlock) => false,
            Err(TryLockError::Poisoned(slot)) => slot.into_inner().session.is_none(),
        }
    }

    /// A group of ``ranks`` (world ranks; their order numbers them in the group), made by every
    /// member with the same ranks; pass it as ``group=`` to any collective. Making a group is an
    /// agreement: every member gets the group, or every member raises the same error. A
    /// member's replacement that has rejoined is taken on first (:meth:`regroup` also waits for
    /// one).
    ///
    /// Raises :class:`MisuseError` for a repeated rank or one that leaves this rank out;
    /// :class:`ProtocolError` naming a member that passed other ranks; :class:`Timeout`,
    /// :class:`PeerLost`.
    #[pyo3(signature = (ranks, *, timeout=CallTimeout::Session))]
    fn group(&self, py: Python<'_>, ranks: Vec<u32>, timeout: CallTimeout) -> PyResult<PyGroup> {
        let timeout = self.deadline(timeout)?;
        let group = self.blocking(py, |session| session.with_timeout(timeout).group(&ranks))?;
        Ok(PyGroup { group })
    }

    /// After deaths: waits until every member of ``ranks`` is alive (a dead one replaced, as
    /// :meth:`wait_for_rank`), makes their group by agreement, and tries again through deaths
    /// and rejoins that happen meanwhile, until ``timeout``. Every member calls it, replacements
    /// included; it replaces a loop of :meth:`wait_for_rank` and :meth:`group` retried on
    /// :class:`PeerLost`.
    ///
    /// Raises :class:`Timeout` naming a member still dead, or not calling it, at the deadline;
    /// :class:`PeerLeft` for a member that left (nobody replaces it); :class:`BrokerLost`; and
    /// as :meth:`group` does.
    #[pyo3(signature = (ranks, *, timeout=CallTimeout::Session))]
    fn regroup(&self, py: Python<'_>, ranks: Vec<u32>, timeout: CallTimeout) -> PyResult<PyGroup> {
        let timeout = self.deadline(timeout)?;
        let group = self.blocking(py, |session| session.regroup(&ranks, timeout))?;
        Ok(PyGroup { group })
    }

    /// After a death: the group of every rank still there, the same on every survivor that
    /// calls it.
    ///
    /// Raises :class:`Timeout` naming a live rank that did not call it; :class:`PeerLost` naming
    /// a rank that died after the survivors agreed (call it again).
    #[pyo3(signature = (*, timeout=CallTimeout::Session))]
    fn shrink(&self, py: Python<'_>, timeout: CallTimeout) -> PyResult<PyGroup> {
        let timeout = self.deadline(timeout)?;
        let group = self.blocking(py, |session| session.with_timeout(timeout).shrink())?;
        Ok(PyGroup { group })
    }

    /// Returns once every rank has entered the barrier.
    ///
    /// Raises :class:`PeerLost`, :class:`PeerLeft`, :class:`Timeout`, :class:`PeerGaveUp` when a
    /// rank it waits for failed its part and left it, or :class:`ProtocolError` when another rank
    /// called another collective.
    #[pyo3(signature = (*, timeout=CallTimeout::Session, group=None))]
    fn barrier(
        &self,
        py: Python<'_>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<()> {
        let timeout = self.deadline(timeout)?;
        let group = group.map(|group| group.group.clone());
        self.blocking(py, |session| {
            on_comm!(session, group.as_ref(), timeout, |c| c.barrier())
        })
    }

    /// Every rank's ``data``, in rank order (this rank's own included). Ranks may give different
    /// lengths.
    ///
    /// Raises as :meth:`barrier` does.
    #[pyo3(signature = (data, *, timeout=CallTimeout::Session, group=None))]
    fn all_gather<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let data = Bytes::get(data)?;
        let timeout = self.deadline(timeout)?;
        let group = group.map(|group| group.group.clone());
        let bytes = data.as_slice();
        self.blocking_then(
            py,
            |session| on_comm!(session, group.as_ref(), timeout, |c| c.all_gather(bytes)),
            |parts| PyList::new(py, parts.iter().map(|part| PyBytes::new(py, part))),
        )
    }

    /// Every rank's ``data``, all of one length, into ``output`` in rank order, with no
    /// ``bytes`` made: ``output`` is any writable C-contiguous buffer of exactly
    /// ``len(data) * size`` bytes (a NumPy array, a torch CPU tensor's memory).
    ///
    /// Raises :class:`MisuseError` for an ``output`` of another length; :class:`ProtocolError`
    /// naming a rank that gave another length; otherwise as :meth:`barrier` does.
    #[pyo3(signature = (data, output, *, timeout=CallTimeout::Session, group=None))]
    fn all_gather_into(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<()> {
        in_to_out!(self, py, data, output, timeout, group, all_gather_into)
    }

    /// Every rank's ``data`` at ``root``, in rank order, as a list of ``bytes`` (ranks may give
    /// different lengths); ``None`` on the other ranks.
    ///
    /// Raises :class:`MisuseError` for a root out of range; otherwise as :meth:`barrier` does.
    #[pyo3(signature = (root, data, *, timeout=CallTimeout::Session, group=None))]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        root: i64,
        data: &Bound<'py, PyAny>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let root = rank_arg(root)?;
        let data = Bytes::get(data)?;
        let timeout = self.deadline(timeout)?;
        let group = group.map(|group| group.group.clone());
        let bytes = data.as_slice();
        self.blocking_then(
            py,
            |session| on_comm!(session, group.as_ref(), timeout, |c| c.gather(root, bytes)),
            |parts| {
                parts
                    .map(|parts| PyList::new(py, parts.iter().map(|part| PyBytes::new(py, part))))
                    .transpose()
            },
        )
    }

    /// Combines every rank's ``data`` with ``op`` (``"sum"``, ``"prod"``, ``"min"``, ``"max"``,
    /// ``"bit_and"``, ``"bit_or"``, ``"bit_xor"``, ``"avg"``), in rank order, into every rank's
    /// ``data``, in place: any writable C-contiguous buffer (a NumPy array, a torch CPU tensor's
    /// ``.numpy()``). The element type is the buffer's, or ``dtype`` (``"bfloat16"`` needs it).
    /// Every rank gets the same bits.
    ///
    /// Raises :class:`MisuseError` for an operation the type lacks (``"avg"`` of integers,
    /// bitwise operations of floats); :class:`ProtocolError` naming a rank that gave another
    /// length; otherwise as :meth:`barrier` does.
    #[pyo3(signature = (data, op="sum", *, dtype=None, timeout=CallTimeout::Session, group=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<()> {
        let op = op_arg(op)?;
        let mut data = Bytes::get_mut(data)?;
        let dtype = dtype_arg(dtype, &data)?;
        let timeout = self.deadline(timeout)?;
        let group = group.map(|group| group.group.clone());
        let data = data.as_mut_slice();
        self.blocking(py, |session| {
            on_comm!(session, group.as_ref(), timeout, |c| c
                .all_reduce_bytes(data, dtype, op))
        })
    }

    /// :meth:`all_reduce` with the result in the root's ``data`` only; the other ranks' ``data``
    /// is unchanged.
    ///
    /// Raises as :meth:`all_reduce` does.
    #[pyo3(signature = (root, data, op="sum", *, dtype=None, timeout=CallTimeout::Session, group=None))]
    #[allow(
        clippy::too_many_arguments,
        reason = "the Python call's arguments, keywords included"
    )]
    fn reduce(
        &self,
        py: Python<'_>,
        root: i64,
        data: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<()> {
        let root = rank_arg(root)?;
        let op = op_arg(op)?;
        let mut data = Bytes::get_mut(data)?;
        let dtype = dtype_arg(dtype, &data)?;
        let timeout = self.deadline(timeout)?;
        let group = group.map(|group| group.group.clone());
        let data = data.as_mut_slice();
        self.blocking(py, |session| {
            on_comm!(session, group.as_ref(), timeout, |c| c
                .reduce_bytes(root, data, dtype, op))
        })
    }

    /// Combines every rank's ``input`` (``world_size`` blocks of ``output``'s length) with
    /// ``op``, in rank order, and writes block ``rank`` of the result into ``output``.
    ///
    /// Raises as :meth:`all_reduce` does.
    #[pyo3(signature = (input, output, op="sum", *, dtype=None, timeout=CallTimeout::Session, group=None))]
    #[allow(
        clippy::too_many_arguments,
        reason = "the Python call's arguments, keywords included"
    )]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<()> {
        let op = op_arg(op)?;
        let input = Bytes::get(input)?;
        let mut output = Bytes::get_mut(output)?;
        let dtype = dtype_arg(dtype, &input)?;
        let timeout = self.deadline(timeout)?;
        let group = group.map(|group| group.group.clone());
        let (input, output) = (input.as_slice(), output.as_mut_slice());
        self.blocking(py, |session| {
            on_comm!(session, group.as_ref(), timeout, |c| c
                .reduce_scatter_bytes(input, output, dtype, op))
        })
    }

    /// The root's ``input`` cut into ``world_size`` equal blocks, block ``rank`` into each rank's
    /// ``output`` (a writable buffer of one block). Other ranks leave ``input`` out.
    ///
    /// Raises :class:`MisuseError` for a root without input or an input of another length;
    /// otherwise as :meth:`barrier` does.
    #[pyo3(signature = (root, input, output, *, timeout=CallTimeout::Session, group=None))]
    fn scatter(
        &self,
        py: Python<'_>,
        root: i64,
        input: Option<&Bound<'_, PyAny>>,
        output: &Bound<'_, PyAny>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<()> {
        let root = rank_arg(root)?;
        let input = input.map(Bytes::get).transpose()?;
        let mut output = Bytes::get_mut(output)?;
        let timeout = self.deadline(timeout)?;
        let group = group.map(|group| group.group.clone());
        let input = input
            .as_ref()
            .filter(|_| root == self.rank_in(group.as_ref()))
            .map(Bytes::as_slice);
        let output = output.as_mut_slice();
        self.blocking(py, |session| {
            on_comm!(session, group.as_ref(), timeout, |c| c
                .scatter(root, input, output))
        })
    }

    /// Block ``q`` of ``input`` to rank ``q``, and block ``q`` of ``output`` from rank ``q``:
    /// both hold ``world_size`` equal blocks.
    ///
    /// Raises :class:`MisuseError` for buffers of different or uneven lengths; otherwise as
    /// :meth:`barrier` does.
    #[pyo3(signature = (input, output, *, timeout=CallTimeout::Session, group=None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<()> {
        in_to_out!(self, py, input, output, timeout, group, all_to_all)
    }

    /// :meth:`all_to_all` with a byte count per rank: ``send_counts[q]`` bytes of ``input`` go
    /// to rank ``q`` and ``recv_counts[q]`` bytes from rank ``q`` land in ``output``, both in rank
    /// order (``world_size`` counts each, adding up to the buffers' lengths).
    ///
    /// Raises :class:`MisuseError` for counts that do not fit the buffers; :class:`ProtocolError`
    /// naming a rank that sent another count; otherwise as :meth:`barrier` does.
    #[pyo3(signature = (input, send_counts, output, recv_counts, *, timeout=CallTimeout::Session, group=None))]
    #[allow(
        clippy::too_many_arguments,
        reason = "the Python call's arguments, keywords included"
    )]
    fn all_to_all_v(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        send_counts: Vec<usize>,
        output: &Bound<'_, PyAny>,
        recv_counts: Vec<usize>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<()> {
        let input = Bytes::get(input)?;
        let mut output = Bytes::get_mut(output)?;
        let timeout = self.deadline(timeout)?;
        let group = group.map(|group| group.group.clone());
        let (input, output) = (input.as_slice(), output.as_mut_slice());
        self.blocking(py, |session| {
            on_comm!(session, group.as_ref(), timeout, |c| c.all_to_all_v(
                input,
                &send_counts,
                output,
                &recv_counts
            ))
        })
    }

    /// ``root``'s ``data`` on every rank, returned as ``bytes`` (on the root too).
    ///
    /// The root must give ``data``; other ranks may leave it out, and what they give is not
    /// sent (as with mpi4py's ``bcast``), though it must still be a buffer.
    ///
    /// Raises :class:`MisuseError` for a root without data or a root out of range; otherwise as
    /// :meth:`barrier` does.
    #[pyo3(signature = (root, data=None, *, timeout=CallTimeout::Session, group=None))]
    fn broadcast<'py>(
        &self,
        py: Python<'py>,
        root: i64,
        data: Option<&Bound<'py, PyAny>>,
        timeout: CallTimeout,
        group: Option<PyRef<'_, PyGroup>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let root = rank_arg(root)?;
        let data = data.map(Bytes::get).transpose()?;
        let timeout = self.deadline(timeout)?;
        let group = group.map(|group| group.group.clone());
        let bytes = data
            .as_ref()
            .filter(|_| root == self.rank_in(group.as_ref()))
            .map(Bytes::as_slice);
        self.blocking_then(
            py,
            |session| {
                on_comm!(session, group.as_ref(), timeout, |c| c
                    .broadcast(root, bytes))
            },
            |received| Ok(PyBytes::new(py, &received)),
        )
    }

    /// Sends ``data`` (any size) to ``rank``, which receives it, in order, with
    /// ``recv(this rank)``. Returns once the data is copied out of ``data``; like ``MPI_Send``, a
    /// message larger than this rank's outbox returns only once ``rank`` is receiving it.
    ///
    /// Raises :class:`MisuseError` for a rank out of range or this rank itself;
    /// :class:`PeerLost`, :class:`PeerLeft`, :class:`Timeout`.
    #[pyo3(signature = (rank, data, *, timeout=CallTimeout::Session))]
    fn send(
        &self,
        py: Python<'_>,
        rank: i64,
        data: &Bound<'_, PyAny>,
        timeout: CallTimeout,
    ) -> PyResult<()> {
        let rank = rank_arg(rank)?;
        let data = Bytes::get(data)?;
        let timeout = self.deadline(timeout)?;
        let bytes = data.as_slice();
        self.blocking(py, |session| {
            session.with_timeout(timeout).send(rank, bytes)
        })
    }

    /// The next message ``rank`` sent this rank with :meth:`send`.
    ///
    /// Raises as :meth:`send` does, and :class:`ProtocolError` for bytes no correct peer sends.
    #[pyo3(signature = (rank, *, timeout=CallTimeout::Session))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        rank: i64,
        timeout: CallTimeout,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let rank = rank_arg(rank)?;
        let timeout = self.deadline(timeout)?;
        // Straight into the `bytes` object, sized by a probe: one copy, and no intermediate
        // buffer whose fresh pages would each fault in (a 4 MiB message took 6.5 ms through a
        // `Vec`, against 0.3 ms into a reused buffer; fresh pages are what is left here).
        // One call, so that a Ctrl-C while the `bytes` is made (no wait in progress) is held
        // back too: it stops the call before the receive takes the message.
        self.call(py, |waits| {
            let started = std::time::Instant::now();
            // The call the user made is a recv: peers and its deadline say so.
            let len = waits.wait(py, |session| session.probe_for_recv(rank, timeout))?;
            waits.stop_if_interrupted()?;
            let left = timeout
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1));
            PyBytes::new_with(py, len, |buffer| {
                waits.stop_if_interrupted()?;
                let received = waits.wait(py, |session| {
                    session.with_timeout(left).recv_into(rank, buffer)
                })?;
                if received != len {
                    // The session is locked for the whole call: the probed message is the one
                    // received.
                    return Err(errors::plain(format!(
                        "recv: rank {rank}'s next message was probed at {len} bytes, but the \
                         receive got {received} (a bug in shmbroker)"
                    )));
                }
                Ok(())
            })
        })
    }

    /// Receives the next message from ``rank`` into ``buffer`` (any writable, C-contiguous
    /// buffer: ``bytearray``, a NumPy array, a ``memoryview`` of one, a torch CPU tensor's
    /// ``.numpy()``), with no copy through ``bytes``. Returns the message's length in bytes.
    ///
    /// Raises :class:`BufferTooSmall` (``.needed``) for a longer message, which is kept, whole,
    /// for the next receive from ``rank``; otherwise as :meth:`recv` does.
    #[pyo3(signature = (rank, buffer, *, timeout=CallTimeout::Session))]
    fn recv_into(
        &self,
        py: Python<'_>,
        rank: i64,
        buffer: &Bound<'_, PyAny>,
        timeout: CallTimeout,
    ) -> PyResult<usize> {
        let rank = rank_arg(rank)?;
        let mut buffer = Bytes::get_mut(buffer)?;
        let timeout = self.deadline(timeout)?;
        let out = buffer.as_mut_slice();
        self.blocking(py, |session| {
            session.with_timeout(timeout).recv_into(rank, out)
        })
    }

    /// The next message from whichever peer has one (served round-robin), as ``(rank,
    /// bytes)``. Peers that left are skipped; one that died is reported once
    /// (:class:`PeerLost`), after what it sent.
    ///
    /// Raises :class:`Timeout` naming every peer still there; :class:`PeerLeft` once every peer
    /// has left; otherwise as :meth:`recv` does.
    #[pyo3(signature = (*, timeout=CallTimeout::Session))]
    fn recv_any<'py>(
        &self,
        py: Python<'py>,
        timeout: CallTimeout,
    ) -> PyResult<(u32, Bound<'py, PyBytes>)> {
        let timeout = self.deadline(timeout)?;
        self.blocking_then(
            py,
            |session| session.with_timeout(timeout).recv_any(),
            |(rank, received)| Ok((rank, PyBytes::new(py, &received))),
        )
    }

    /// :meth:`recv_any` into ``buffer`` (as :meth:`recv_into`): returns ``(rank, length)``.
    ///
    /// Raises :class:`BufferTooSmall` (``.rank``, ``.needed``) for a longer message, which is
    /// kept: receive it with ``recv(error.rank)``; otherwise as :meth:`recv_any` does.
    #[pyo3(signature = (buffer, *, timeout=CallTimeout::Session))]
    fn recv_any_into(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        timeout: CallTimeout,
    ) -> PyResult<(u32, usize)> {
        let mut buffer = Bytes::get_mut(buffer)?;
        let timeout = self.deadline(timeout)?;
        let out = buffer.as_mut_slice();
        self.blocking(py, |session| {
            session.with_timeout(timeout).recv_any_into(out)
        })
    }

    /// The next message from ``rank`` if one has started to arrive, else ``None`` at once.
    ///
    /// Raises as :meth:`recv` does.
    fn try_recv<'py>(&self, py: Python<'py>, rank: i64) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let rank = rank_arg(rank)?;
        self.blocking_then(
            py,
            |session| session.try_recv(rank),
            |received| Ok(received.map(|bytes| PyBytes::new(py, &bytes))),
        )
    }

    /// The next message from any peer if one has started to arrive, as ``(rank, bytes)``, else
    /// ``None`` at once.
    ///
    /// Raises as :meth:`recv_any` does, but never :class:`Timeout` for want of a message.
    fn try_recv_any<'py>(&self, py: Python<'py>) -> PyResult<Option<(u32, Bound<'py, PyBytes>)>> {
        self.blocking_then(py, Session::try_recv_any, |received| {
            Ok(received.map(|(rank, bytes)| (rank, PyBytes::new(py, &bytes))))
        })
    }

    /// This rank's readiness file descriptor, for ``select``, ``epoll`` or an event loop: it
    /// becomes readable when a message is waiting from any peer (or one has died or left), once
    /// :meth:`try_recv_any` has returned ``None``. Take what is there with
    /// :meth:`try_recv_any` until it returns ``None`` again, then wait on the fd; never read
    /// it (the session does). It stays open as long as the session; :func:`recv_any_async` is
    /// this done for asyncio.
    fn readiness_fd(&self) -> PyResult<RawFd> {
        let slot = self.lock()?;
        let session = slot
            .session
            .as_ref()
            .ok_or_else(|| errors::plain("session is closed"))?;
        Ok(std::os::fd::AsRawFd::as_raw_fd(&session.readiness_fd()))
    }

    /// How this session moves fds, as ``(chosen, used)``: ``chosen`` is ``"auto"``,
    /// ``"pidfd"`` or ``"relay"`` (``SHMBROKER_FD_TRANSPORT``); ``used`` is how its exchanges
    /// (:meth:`exchange_fds`, :meth:`broadcast_fd`) have moved them so far: ``None`` before the
    /// first, ``"pidfd"`` while every import was a ``pidfd_getfd``, ``"relay"`` from the first
    /// that went through the broker (chosen, or refused by the kernel under ``"auto"``: inside a
    /// container without ``CAP_SYS_PTRACE``, say).
    fn fd_transport(&self) -> PyResult<(&'static str, Option<&'static str>)> {
        use shmbroker::session::FdTransport;
        let name = |transport| match transport {
            FdTransport::Auto => "auto",
            FdTransport::Pidfd => "pidfd",
            FdTransport::Relay => "relay",
        };
        let slot = self.lock()?;
        let session = slot
            .session
            .as_ref()
            .ok_or_else(|| errors::plain("session is closed"))?;
        Ok((
            name(session.fd_transport()),
            session.fd_transport_used().map(name),
        ))
    }

    /// The length in bytes of the next message from ``rank``, waiting for it to arrive, without
    /// receiving it: size a buffer for :meth:`recv_into`.
    ///
    /// Raises as :meth:`recv` does.
    #[pyo3(signature = (rank, *, timeout=CallTimeout::Session))]
    fn probe(&self, py: Python<'_>, rank: i64, timeout: CallTimeout) -> PyResult<usize> {
        let rank = rank_arg(rank)?;
        let timeout = self.deadline(timeout)?;
        self.blocking(py, |session| session.with_timeout(timeout).probe(rank))
    }

    /// Every rank's ``fd`` (an int, or an object with ``fileno()``), in rank order, as new file
    /// descriptors this process owns: close each with ``os.close`` (or hand it to
    /// ``os.fdopen``, ``mmap.mmap``). This rank's own entry is a duplicate of ``fd``
    /// (``os.dup``), so closing every entry never closes ``fd`` itself. ``fd`` must stay open
    /// during the call.
    ///
    /// Raises :class:`MisuseError` for an fd that is not open; :class:`ProtocolError` for a
    /// peer's fd that no longer names the file it offered; :class:`ResourceError` when an fd
    /// cannot be moved; otherwise as :meth:`all_gather` does.
    #[pyo3(signature = (fd, *, timeout=CallTimeout::Session))]
    fn exchange_fds<'py>(
        &self,
        py: Python<'py>,
        fd: &Bound<'py, PyAny>,
        timeout: CallTimeout,
    ) -> PyResult<Bound<'py, PyList>> {
        let fd = borrowed(fd_arg(fd)?);
        let timeout = self.deadline(timeout)?;
        self.blocking_then(
            py,
            |session| session.with_timeout(timeout).exchange_fds(fd),
            |fds| PyList::new(py, fds.into_iter().map(IntoRawFd::into_raw_fd)),
        )
    }

    /// ``root``'s ``fd`` on every rank, as a new file descriptor this process owns (on the root,
    /// a duplicate of ``fd``). The root must give ``fd``; other ranks may leave it out, and
    /// what they give is ignored.
    ///
    /// Raises as :meth:`exchange_fds` does.
    #[pyo3(signature = (root, fd=None, *, timeout=CallTimeout::Session))]
    fn broadcast_fd(
        &self,
        py: Python<'_>,
        root: i64,
        fd: Option<&Bound<'_, PyAny>>,
        timeout: CallTimeout,
    ) -> PyResult<RawFd> {
        let root = rank_arg(root)?;
        let fd = match fd {
            Some(fd) if root == self.rank => Some(borrowed(fd_arg(fd)?)),
            _ => None,
        };
        let timeout = self.deadline(timeout)?;
        let received = self.blocking(py, |session| {
            session.with_timeout(timeout).broadcast_fd(root, fd)
        })?;
        Ok(received.into_raw_fd())
    }

    /// Every rank's ``fds`` (an iterable of ints or objects with ``fileno()``; every rank
    /// passes as many, at most :data:`MAX_FDS_PER_EXCHANGE`), as a list by rank of lists in each
    /// rank's order, of new file descriptors this process owns. This rank's own entries are
    /// duplicates. The whole batch takes two ring trips, as one fd does.
    ///
    /// Raises :class:`ProtocolError` naming a rank that passed another number of fds, or sent a
    /// forged ticket (on every rank); :class:`ResourceError` when a rank has no room for the
    /// fds (on every rank, naming it); otherwise as :meth:`exchange_fds` does.
    #[pyo3(signature = (fds, *, timeout=CallTimeout::Session))]
    fn exchange_fd_batch<'py>(
        &self,
        py: Python<'py>,
        fds: &Bound<'py, PyAny>,
        timeout: CallTimeout,
    ) -> PyResult<Bound<'py, PyList>> {
        let (_items, fds) = fd_list_arg(fds)?;
        let timeout = self.deadline(timeout)?;
        self.blocking_then(
            py,
            |session| session.with_timeout(timeout).exchange_fd_batch(&fds),
            |batches| {
                let numbers = batches.into_iter().map(|batch| {
                    batch
                        .into_iter()
                        .map(IntoRawFd::into_raw_fd)
                        .collect::<Vec<RawFd>>()
                });
                PyList::new(py, numbers)
            },
        )
    }

    /// ``root``'s ``fds`` on every rank, as a list in the root's order of new file descriptors
    /// this process owns (on the root, duplicates). The root gives ``fds``; the others give
    /// ``count``, the number of fds the root gives (on the root it defaults to ``len(fds)``),
    /// and what they give as ``fds`` is ignored, as :meth:`broadcast_fd` does.
    ///
    /// Raises :class:`MisuseError` when a rank other than the root gives no ``count``;
    /// otherwise as :meth:`exchange_fd_batch` does.
    #[pyo3(signature = (root, fds=None, *, count=None, timeout=CallTimeout::Session))]
    fn broadcast_fd_batch<'py>(
        &self,
        py: Python<'py>,
        root: i64,
        fds: Option<&Bound<'py, PyAny>>,
        count: Option<usize>,
        timeout: CallTimeout,
    ) -> PyResult<Bound<'py, PyList>> {
        let root = rank_arg(root)?;
        let (_items, fds) = match fds {
            Some(fds) if root == self.rank => fd_list_arg(fds)?,
            _ => (Vec::new(), Vec::new()),
        };
        let count = match (count, root == self.rank) {
            (Some(count), _) => count,
            (None, true) => fds.len(),
            (None, false) => {
                return Err(errors::misuse(format!(
                    "rank {} must say how many fds rank {root} broadcasts (count=)",
                    self.rank
                )));
            }
        };
        let timeout = self.deadline(timeout)?;
        self.blocking_then(
            py,
            |session| {
                session
                    .with_timeout(timeout)
                    .broadcast_fd_batch(root, &fds, count)
            },
            |received| PyList::new(py, received.into_iter().map(IntoRawFd::into_raw_fd)),
        )
    }

    /// A writable buffer of ``size`` bytes in this rank's outbox, as a :class:`Loan`: fill
    /// ``loan.buffer`` and hand it to peers by reference with :meth:`send_loan` or
    /// :meth:`broadcast_loan`. Waits while the outbox is full of buffers peers still hold.
    ///
    /// Raises :class:`ResourceError` when ``size`` is more than the outbox can ever hold;
    /// :class:`Timeout`.
    #[pyo3(signature = (size, *, timeout=CallTimeout::Session))]
    fn loan(&self, py: Python<'_>, size: usize, timeout: CallTimeout) -> PyResult<loans::PyLoan> {
        let timeout = self.deadline(timeout)?;
        self.blocking_then(
            py,
            self.within(timeout, |session| session.loan(size)),
            |loan| loans::PyLoan::new(py, loan),
        )
    }

    /// A zeroed buffer of ``size`` bytes in this rank's outbox, as a :class:`Loan` this rank
    /// keeps: a *symmetric buffer*. :meth:`all_reduce` of ``loan.buffer``, or of a NumPy array
    /// or a cast memoryview over it, is read by the peers where it lies, with no copy in (see
    /// :meth:`reductions_read_in_place`). The other ranks need not use one. It holds its part of
    /// the outbox until released (its ``with`` block) or sent.
    ///
    /// Raises as :meth:`loan` does.
    #[pyo3(signature = (size, *, timeout=CallTimeout::Session))]
    fn symmetric(
        &self,
        py: Python<'_>,
        size: usize,
        timeout: CallTimeout,
    ) -> PyResult<loans::PyLoan> {
        let timeout = self.deadline(timeout)?;
        let make = self.within(timeout, |session| {
            session
                .symmetric::<u8>(size)
                .map(shmbroker::Symmetric::into_loan)
        });
        self.blocking_then(py, make, |loan| loans::PyLoan::new(py, loan))
    }

    /// How many pieces of this session's all-reduces the peers read where they lay, with no copy
    /// in (those of symmetric buffers: :meth:`symmetric`). An all-reduce in one shot (up to 2
    /// KiB, or 128 KiB of all ranks' contributions together) has none; a larger one has one per
    /// MiB or part of it. A program checks with it that its buffers are on that path.
    fn reductions_read_in_place(&self, py: Python<'_>) -> PyResult<u64> {
        self.blocking(py, |session| Ok(session.reductions_read_in_place()))
    }

    /// Hands ``loan`` to ``rank`` by reference: it takes it with :meth:`recv_loan` (or copies it
    /// with :meth:`recv`). The loan is sent whether or not this raises; its buffer comes back to
    /// the outbox when ``rank`` is done with it.
    ///
    /// Raises :class:`MisuseError` for a loan already sent or released; otherwise as
    /// :meth:`send` does.
    #[pyo3(signature = (rank, loan, *, timeout=CallTimeout::Session))]
    fn send_loan(
        &self,
        py: Python<'_>,
        rank: i64,
        loan: &loans::PyLoan,
        timeout: CallTimeout,
    ) -> PyResult<()> {
        let rank = rank_arg(rank)?;
        let timeout = self.deadline(timeout)?;
        let loan = loan.take(py)?;
        self.blocking(
            py,
            self.within(timeout, |session| session.send_loan(rank, loan)),
        )
    }

    /// The next message from ``rank``, which must be a loan, as a :class:`LoanView` of the
    /// lender's buffer, read in place.
    ///
    /// Raises :class:`MisuseError` when the next message from ``rank`` is not a loan (it stays
    /// queued for :meth:`recv`); otherwise as :meth:`recv` does.
    #[pyo3(signature = (rank, *, timeout=CallTimeout::Session))]
    fn recv_loan(
        &self,
        py: Python<'_>,
        rank: i64,
        timeout: CallTimeout,
    ) -> PyResult<loans::PyLoanView> {
        let rank = rank_arg(rank)?;
        let timeout = self.deadline(timeout)?;
        self.blocking_then(
            py,
            self.within(timeout, |session| session.recv_loan(rank)),
            |view| loans::PyLoanView::new(py, view),
        )
    }

    /// Lends ``loan`` to ``rank`` by reference, for a typed channel's record to carry: the 16
    /// ``bytes`` returned (offset and length in this rank's outbox, little-endian ``<QI4x``).
    /// ``rank`` views it with :meth:`view_loan_ref`, once. Nothing is sent.
    ///
    /// Raises :class:`MisuseError` for a rank out of range or this rank.
    fn lend_ref<'py>(
        &self,
        py: Python<'py>,
        rank: i64,
        loan: &loans::PyLoan,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let rank = rank_arg(rank)?;
        let loan = loan.take(py)?;
        self.blocking_then(
            py,
            |session| session.lend_ref(rank, loan),
            |lent| Ok(PyBytes::new(py, bytemuck::bytes_of(&lent))),
        )
    }

    /// A :class:`LoanView` of the loan ``rank`` lent this rank as ``lent`` (the 16 bytes
    /// :meth:`lend_ref` gave it, from a channel record), read in place.
    ///
    /// Raises :class:`ProtocolError` naming ``rank`` for a reference outside its outbox;
    /// :class:`MisuseError` for ``lent`` not 16 bytes.
    fn view_loan_ref(
        &self,
        py: Python<'_>,
        rank: i64,
        lent: &Bound<'_, PyAny>,
    ) -> PyResult<loans::PyLoanView> {
        let rank = rank_arg(rank)?;
        let lent = Bytes::get(lent)?;
        let lent: shmbroker::bindings::PayloadRef =
            bytemuck::try_pod_read_unaligned(lent.as_slice()).map_err(|_| {
                errors::misuse("a loan reference is 16 bytes (from Session.lend_ref)")
            })?;
        let lent = shmbroker::bindings::PayloadRef { _pad0: 0, ..lent };
        self.blocking_then(
            py,
            |session| session.view_loan_ref(rank, lent),
            |view| loans::PyLoanView::new(py, view),
        )
    }

    /// ``root``'s loan on every other rank, by reference: the root passes ``loan`` and gets
    /// ``None``; the others pass nothing and get a :class:`LoanView` of the root's buffer.
    ///
    /// Raises :class:`MisuseError` when the root passes no loan or another rank passes one;
    /// otherwise as :meth:`broadcast` does.
    #[pyo3(signature = (root, loan=None, *, timeout=CallTimeout::Session))]
    fn broadcast_loan(
        &self,
        py: Python<'_>,
        root: i64,
        loan: Option<&loans::PyLoan>,
        timeout: CallTimeout,
    ) -> PyResult<Option<loans::PyLoanView>> {
        let root = rank_arg(root)?;
        let timeout = self.deadline(timeout)?;
        let loan = loan.map(|loan| loan.take(py)).transpose()?;
        self.blocking_then(
            py,
            self.within(timeout, |session| session.broadcast_loan(root, loan)),
            |view| {
                view.map(|view| loans::PyLoanView::new(py, view))
                    .transpose()
            },
        )
    }

    /// Every rank's GPU handle (a :class:`shmbroker.GpuHandle`), in rank order, as
    /// ``(GpuHandle, fd)`` pairs: ``fd`` is a new file descriptor this process owns for the kinds
    /// whose handle is an fd (``handle.carries_fd``), ``None`` for the others. Give ``fd``
    /// exactly when this rank's kind carries one. The library never loads a GPU runtime: open
    /// what arrives with the runtime that exported it.
    ///
    /// Raises :class:`MisuseError` for an fd given (or missing) against the kind;
    /// :class:`ProtocolError` when a peer's kind is unknown; otherwise as :meth:`exchange_fds`.
    #[pyo3(signature = (handle, fd=None, *, timeout=CallTimeout::Session))]
    fn all_gather_gpu_handles<'py>(
        &self,
        py: Python<'py>,
        handle: &Bound<'py, PyAny>,
        fd: Option<&Bound<'py, PyAny>>,
        timeout: CallTimeout,
    ) -> PyResult<Bound<'py, PyList>> {
        let own = gpu_handle_arg(handle)?;
        let fd = fd.map(fd_arg).transpose()?.map(borrowed);
        let timeout = self.deadline(timeout)?;
        self.blocking_then(
            py,
            self.within(timeout, |session| session.all_gather_gpu_handles(&own, fd)),
            |gathered| {
                let pairs = gathered
                    .into_iter()
                    .map(|(handle, fd)| {
                        Ok((
                            gpu_handle_object(py, &handle)?,
                            fd.map(IntoRawFd::into_raw_fd),
                        ))
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                PyList::new(py, pairs)
            },
        )
    }

    /// ``root``'s GPU handle on every rank, as ``(GpuHandle, fd)`` (as in
    /// :meth:`all_gather_gpu_handles`; on the root, ``fd`` is a duplicate of its own). The root
    /// gives ``handle`` (and ``fd`` when its kind carries one); other ranks leave both out.
    ///
    /// Raises as :meth:`all_gather_gpu_handles` does, and :class:`MisuseError` when the root
    /// gives no handle or another rank gives one.
    #[pyo3(signature = (root, handle=None, fd=None, *, timeout=CallTimeout::Session))]
    fn broadcast_gpu_handle<'py>(
        &self,
        py: Python<'py>,
        root: i64,
        handle: Option<&Bound<'py, PyAny>>,
        fd: Option<&Bound<'py, PyAny>>,
        timeout: CallTimeout,
    ) -> PyResult<(Bound<'py, PyAny>, Option<RawFd>)> {
        let root = rank_arg(root)?;
        let own = handle.map(gpu_handle_arg).transpose()?;
        let fd = fd.map(fd_arg).transpose()?.map(borrowed);
        let timeout = self.deadline(timeout)?;
        let own = own.as_ref().map(|own| (own, fd));
        self.blocking_then(
            py,
            self.within(timeout, |session| session.broadcast_gpu_handle(root, own)),
            |(handle, fd)| {
                Ok((
                    gpu_handle_object(py, &handle)?,
                    fd.map(IntoRawFd::into_raw_fd),
                ))
            },
        )
    }

    /// Leaves the session: peers waiting on this rank are told it left (:class:`PeerLeft`).
    /// Closing a closed session does nothing; every other call on it raises
    /// :class:`shmbroker.Error`.
    ///
    /// In a forked child, closes only the child's copy: the parent's session goes on.
    ///
    /// Raises :class:`shmbroker.Error` while another thread is in a call on the session.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let session = match self.slot.try_lock() {
            Ok(mut slot) => slot.session.take(),
            // A call panicked: leave anyway.
            Err(TryLockError::Poisoned(slot)) => slot.into_inner().session.take(),
            Err(TryLockError::WouldBlock) => {
                return Err(errors::plain(
                    "session is busy: another thread is in a call on it, so it cannot be closed",
                ));
            }
        };
        match session {
            // A forked child's copy (see `Slot::pid`): only this copy is closed.
            Some(session) if self.forked() => std::mem::forget(session),
            Some(session) => py.detach(|| drop(session)),
            None => {}
        }
        Ok(())
    }

    /// A typed channel from this rank to ``peer``: a ring of its own, made by the broker, of
    /// ``capacity`` records (a power of two from 2 to 2**20) of ``record`` (a number of bytes
    /// from 1 to 4096, or a NumPy dtype, structured or not). ``peer`` calls
    /// :meth:`channel_from` with the same ``tag`` and ``record``.
    ///
    /// Raises :class:`MisuseError` for a bad record, capacity or peer;
    /// :class:`ResourceError` when the broker made no ring; :class:`Timeout`.
    #[pyo3(signature = (peer, tag, record, capacity=1024))]
    fn channel_to(
        &self,
        py: Python<'_>,
        peer: i64,
        tag: u64,
        record: &Bound<'_, PyAny>,
        capacity: usize,
    ) -> PyResult<channels::PyChannelSender> {
        let peer = rank_arg(peer)?;
        let bytes = channels::record_bytes(record)?;
        let end = self.blocking(py, |session| {
            session.raw_channel_to(peer, tag, bytes, capacity)
        })?;
        Ok(channels::PyChannelSender::new(end))
    }

    /// The typed channel ``peer`` makes to this rank with :meth:`channel_to` (its next one),
    /// waiting for it within the session's deadline.
    ///
    /// Raises :class:`MisuseError` when ``peer``'s tag or record size is not this end's (the
    /// message says what each has; the channel is closed); :class:`Timeout`; ``peer``'s
    /// departure.
    fn channel_from(
        &self,
        py: Python<'_>,
        peer: i64,
        tag: u64,
        record: &Bound<'_, PyAny>,
    ) -> PyResult<channels::PyChannelReceiver> {
        let peer = rank_arg(peer)?;
        let bytes = channels::record_bytes(record)?;
        let end = self.blocking(py, |session| session.raw_channel_from(peer, tag, bytes))?;
        Ok(channels::PyChannelReceiver::new(end))
    }

    /// Splits the session into a :class:`Sender` (sends, and the root's side of a world
    /// broadcast) and a :class:`Receiver` (receives), for two threads: each releases the GIL
    /// while it waits, and a receive never waits behind a send or broadcast that waits for a
    /// slow peer's room. This object is closed from then on (its other calls raise);
    /// :meth:`Sender.rejoin` gives the whole session back, for collectives.
    ///
    /// Raises :class:`shmbroker.Error` while another thread is in a call on the session.
    fn split(&self) -> PyResult<(split::PySender, split::PyReceiver)> {
        let mut slot = self.lock()?;
        let session = slot
            .session
            .take()
            .ok_or_else(|| errors::plain("session is closed"))?;
        Ok(split::split(session, self.timeout, self.pid))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { ", closed" } else { "" };
        format!(
            "<shmbroker.Session rank {} of {}{state}>",
            self.rank, self.world_size
        )
    }
}
