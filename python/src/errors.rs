//! Every [`shmbroker::Error`] as the Python exception it is raised as.
//!
//! The classes are defined in `shmbroker/_errors.py` (so that they can have constructors, pickle,
//! and be a `ValueError` too); this module only chooses among them. The message is always the
//! Rust error's `Display`, which names the rank involved.
//!
//! The class comes from the library's one table of kinds (`shmbroker::ErrorKind`, which the C
//! ABI's codes follow too), one to one; the attributes from the error's fields.

use pyo3::prelude::*;
use shmbroker::handshake::Error as HandshakeError;
use shmbroker::session::LeftAfter;
use shmbroker::{Error, ErrorKind};

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
    pyo3::import_exception!(shmbroker._errors, ChannelClosed);
}

/// `shmbroker.Error` with `message`: a closed session, a busy one, a fork's copy.
pub fn plain(message: impl Into<String>) -> PyErr {
    py::Error::new_err(message.into())
}

/// `shmbroker.MisuseError` with `message`: a bad argument found before calling the library.
pub fn misuse(message: impl Into<String>) -> PyErr {
    py::MisuseError::new_err(message.into())
}

/// The Python exception for `error`: its class by kind, its attributes from its fields.
pub fn to_py(error: Error) -> PyErr {
    let message = error.to_string();
    let rank = error.rank();
    match error.kind() {
        ErrorKind::PeerLost => {
            let diagnosis = match error {
                Error::PeerLost { diagnosis, .. } => diagnosis,
                _ => Vec::new(),
            };
            py::PeerLost::new_err((message, rank, diagnosis))
        }
        ErrorKind::PeerRejoined => {
            let times = match error {
                Error::PeerRejoined { times, .. } => times,
                _ => 0,
            };
            py::PeerRejoined::new_err((message, rank, times))
        }
        ErrorKind::PeerLeft => {
            let (after, after_died) = match error {
                Error::PeerLeft {
                    after: Some(LeftAfter::Died(cause)),
                    ..
                } => (Some(cause), true),
                Error::PeerLeft {
                    after: Some(LeftAfter::TimedOut(cause)),
                    ..
                } => (Some(cause), false),
                _ => (None, false),
            };
            py::PeerLeft::new_err((message, rank, after, after_died))
        }
        ErrorKind::PeerNeverJoined => {
            let (after, after_left) = match error {
                Error::PeerNeverJoined {
                    after, after_left, ..
                }
                | Error::Logon(HandshakeError::PeerNeverJoined {
                    after, after_left, ..
                })
                | Error::Relay {
                    source:
                        HandshakeError::PeerNeverJoined {
                            after, after_left, ..
                        },
                    ..
                } => (after, after_left),
                _ => (0, false),
            };
            py::PeerNeverJoined::new_err((message, rank, after, after_left))
        }
        ErrorKind::PeerGaveUp => {
            let named = match error {
                Error::PeerGaveUp { named, .. } => named,
                _ => None,
            };
            py::PeerGaveUp::new_err((message, rank, named))
        }
        ErrorKind::Timeout => match error {
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
            _ => py::Error::new_err(message),
        },
        ErrorKind::Protocol => py::ProtocolError::new_err((message, rank)),
        ErrorKind::BrokerLost => py::BrokerLost::new_err(message),
        ErrorKind::Logon => py::LogonError::new_err(message),
        ErrorKind::BufferTooSmall => {
            let needed = match error {
                Error::BufferTooSmall { needed, .. } => needed,
                _ => 0,
            };
            py::BufferTooSmall::new_err((message, rank, needed))
        }
        ErrorKind::Misuse => py::MisuseError::new_err(message),
        ErrorKind::Resource => py::ResourceError::new_err(message),
        ErrorKind::ChannelClosed => py::ChannelClosed::new_err((message, rank)),
        // An interrupt (a signal's own exception comes first where there is one), and a kind
        // added later: at least an Error.
        _ => py::Error::new_err(message),
    }
}
