//! Every [`shmbroker::Error`] as the Python exception it is raised as.
//!
//! The classes are defined in `shmbroker/_errors.py` (so that they can have constructors, pickle,
//! and be a `ValueError` too); this module only chooses among them. The message is always the
//! Rust error's `Display`, which names the rank involved.
//!
//! | Rust error | Python exception |
//! |---|---|
//! | `PeerLost { rank, diagnosis }`, a logon or fd relay that saw a peer die | `PeerLost` (`.rank`, `.diagnosis`) |
//! | `PeerLeft { rank, after }` | `PeerLeft` (`.rank`, `.after`, `.after_died`) |
//! | `PeerNeverJoined { rank, after, after_left }`, a logon or fd relay that waited for it | `PeerNeverJoined` (`.rank`, `.after`, `.after_left`) |
//! | `PeerGaveUp { rank, named, .. }` | `PeerGaveUp` (`.rank`, `.named`) |
//! | `Timeout { op, waiting_for, timeout, diagnosis }` | `Timeout` (`.op`, `.waiting_for`, `.timeout`, `.diagnosis`) |
//! | `Protocol`, `Corrupted`, `CollectiveMismatch`, `GroupMismatch`, `Outbox`, `StaleFdTicket` (each names a peer) | `ProtocolError` (`.rank`) |
//! | `BrokerLost`, a logon or fd relay that found the broker gone | `BrokerLost` |
//! | `Logon`, `Launch` | `LogonError` |
//! | `BufferTooSmall { peer, needed }` (the message is kept) | `BufferTooSmall` (`.rank`, `.needed`; a `MisuseError`) |
//! | `Misuse`, `RankOutOfRange` | `MisuseError` (also a `ValueError`) |
//! | `Io`, `OwnOutbox`, `FdTransport`, `Relay` | `ResourceError` |
//! | a variant added later | `Error` |
//!
//! This follows the C ABI's codes (`capi/src/lib.rs`), with two refinements: a logon or an fd
//! relay that failed because a peer died or the broker went is reported as that death or that
//! loss, and a failed relay is a `ResourceError` (the C ABI counts it as a protocol error).

use pyo3::prelude::*;
use shmbroker::Error;
use shmbroker::handshake::Error as HandshakeError;
use shmbroker::session::LeftAfter;

/// The classes of `shmbroker/_errors.py`, each under its Python name.
mod py {
    pyo3::import_exception!(shmbroker._errors, Error);
    pyo3::import_exception!(shmbroker._errors, PeerLost);
    pyo3::import_exception!(shmbroker._errors, PeerLeft);
    pyo3::import_exception!(shmbroker._errors, PeerNeverJoined);
    pyo3::import_exception!(shmbroker._errors, PeerGaveUp);
    pyo3::import_exception!(shmbroker._errors, PeerRejoined);
    pyo3::import_exception!(shmbroker._errors, ProtocolError);
    pyo3::import_exception!(shmbroker._errors, Timeout);
    pyo3::import_exception!(shmbroker._errors, BrokerLost);
    pyo3::import_exception!(shmbroker._errors, LogonError);
    pyo3::import_exception!(shmbroker._errors, MisuseError);
    pyo3::import_exception!(shmbroker._errors, BufferTooSmall);
    pyo3::import_exception!(shmbroker._errors, ResourceError);
}

/// `shmbroker.Error` with `message`: a closed session, a busy one, a fork's copy.
pub fn plain(message: impl Into<String>) -> PyErr {
    py::Error::new_err(message.into())
}

/// `shmbroker.MisuseError` with `message`: a bad argument found before calling the library.
pub fn misuse(message: impl Into<String>) -> PyErr {
    py::MisuseError::new_err(message.into())
}

/// The Python exception for `error`.
pub fn to_py(error: Error) -> PyErr {
    let message = error.to_string();
    match error {
        Error::PeerLost { rank, diagnosis } => py::PeerLost::new_err((message, rank, diagnosis)),
        Error::PeerRejoined { rank, times } => py::PeerRejoined::new_err((message, rank, times)),
        Error::PeerLeft { rank, after, .. } => {
            let (after, after_died) = match after {
                Some(LeftAfter::Died(cause)) => (Some(cause), true),
                Some(LeftAfter::TimedOut(cause)) => (Some(cause), false),
                None => (None, false),
            };
            py::PeerLeft::new_err((message, rank, after, after_died))
        }
        Error::PeerNeverJoined {
            rank,
            after,
            after_left,
        }
        | Error::Logon(HandshakeError::PeerNeverJoined {
            rank,
            after,
            after_left,
            ..
        })
        | Error::Relay {
            source:
                HandshakeError::PeerNeverJoined {
                    rank,
                    after,
                    after_left,
                    ..
                },
            ..
        } => py::PeerNeverJoined::new_err((message, rank, after, after_left)),
        Error::PeerGaveUp { rank, named, .. } => py::PeerGaveUp::new_err((message, rank, named)),
        Error::Timeout {
            op,
            waiting_for,
            timeout,
            diagnosis,
            stopped,
        } => py::Timeout::new_err((
            message,
            op,
            waiting_for,
            timeout.as_secs_f64(),
            diagnosis,
            stopped,
        )),
        Error::Protocol { peer, .. }
        | Error::Corrupted { peer, .. }
        | Error::CollectiveMismatch { peer, .. }
        | Error::GroupMismatch { peer, .. }
        | Error::Outbox { peer, .. } => py::ProtocolError::new_err((message, peer)),
        Error::StaleFdTicket { exporter, .. } => py::ProtocolError::new_err((message, exporter)),
        Error::BrokerLost => py::BrokerLost::new_err(message),
        Error::Logon(HandshakeError::PeerLost { rank, .. })
        | Error::Relay {
            source: HandshakeError::PeerLost { rank, .. },
            ..
        } => py::PeerLost::new_err((message, rank)),
        Error::Logon(HandshakeError::BrokerLost { .. })
        | Error::Relay {
            source: HandshakeError::BrokerLost { .. },
            ..
        } => py::BrokerLost::new_err(message),
        Error::Logon(_) | Error::Launch(_) => py::LogonError::new_err(message),
        Error::BufferTooSmall { peer, needed, .. } => {
            py::BufferTooSmall::new_err((message, peer, needed))
        }
        Error::Misuse(_) | Error::RankOutOfRange { .. } => py::MisuseError::new_err(message),
        Error::Io { .. } | Error::OwnOutbox(_) | Error::FdTransport(_) | Error::Relay { .. } => {
            py::ResourceError::new_err(message)
        }
        // `shmbroker::Error` is non-exhaustive: a variant added later is at least an Error.
        _ => py::Error::new_err(message),
    }
}
