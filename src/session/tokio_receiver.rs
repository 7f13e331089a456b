//! [`AsyncReceiver`]: `async fn recv_any` for tokio (the `tokio` feature).
//!
//! # How it waits
//!
//! The receiver's readiness eventfd (see the `any` module) is registered with the runtime's
//! reactor through `AsyncFd` (a duplicate of it, which shares its count and its wake-ups). The
//! wait is the library's register/recheck rule, with tokio's readiness flag in the place of the
//! `poll` call:
//!
//! 1. clear tokio's readiness flag;
//! 2. `try_recv_any`: a message is taken if one is there; if not, every ring is armed before it
//!    returns `None`;
//! 3. await readability.
//!
//! A message that arrives after step 2 looked at its ring finds the ring armed, so its sender
//! writes the eventfd; the reactor then sets the flag, and step 3 returns. A message that arrives
//! before step 2 is seen by it. Clearing the flag in step 1, before the look and never after it,
//! is what keeps a wake-up from being thrown away.
//!
//! A death or a departure closes the rings, and a close of an armed ring writes the eventfd too
//! (the `loom_readiness_wakes_on_close` model), so the task wakes and `try_recv_any` reports it.
//!
//! # What blocks the runtime's thread
//!
//! Only what `try_recv_any` does once a message is there: copying it out, and for a message
//! larger than the eager limit, waiting for its chunks while its sender writes them, as
//! [`Session::recv`](super::Session::recv) does. A program receiving messages of many megabytes
//! gives that receive a thread of its own (`spawn_blocking`) instead.

use super::split::Receiver;
use crate::error::Error;
use std::os::fd::OwnedFd;
use std::time::Duration;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A [`Receiver`] whose `recv_any` is an `async fn`, for a tokio runtime with IO and time
/// enabled (`enable_all`, as `#[tokio::main]` does). Made by [`Receiver::into_async`].
///
/// ```no_run
/// # async fn serve(session: shmbroker::Session) -> Result<(), shmbroker::Error> {
/// let (sender, receiver) = session.split();
/// let receiver = receiver.into_async()?;
/// loop {
///     let (peer, request) = receiver.recv_any().await?;
///     sender.send(peer, &request)?;
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct AsyncReceiver {
    receiver: Receiver,
    readiness: AsyncFd<OwnedFd>,
}

impl Receiver {
    /// This receiver, with its readiness fd registered with the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when called outside a tokio runtime; [`Error::Io`] when the fd cannot be
    /// duplicated or registered. (A runtime built without IO makes tokio panic here, as its own
    /// IO types do.)
    pub fn into_async(self) -> Result<AsyncReceiver, Error> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Misuse(
                "Receiver::into_async must be called from within a tokio runtime".into(),
            ));
        }
        let fd = self
            .readiness_fd()
            .try_clone_to_owned()
            .map_err(|source| Error::Io {
                what: "duplicating the readiness eventfd",
                source,
            })?;
        // SAFETY: `fd` is an open fd this function owns, moved into the `AsyncFd`, which keeps
        // it open until it is dropped; an `OwnedFd` always returns the same raw fd.
        let registered = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) };
        let readiness = registered.map_err(|error| Error::Io {
            what: "registering the readiness eventfd with tokio",
            source: error.into_parts().1,
        })?;
        Ok(AsyncReceiver {
            receiver: self,
            readiness,
        })
    }
}

/// An [`AsyncReceiver`] whose receives have their own deadline: [`AsyncReceiver::with_timeout`].
#[derive(Debug)]
pub struct TimedAsyncReceiver<'a> {
    receiver: &'a AsyncReceiver,
    timeout: Duration,
}

impl TimedAsyncReceiver<'_> {
    /// [`AsyncReceiver::recv_any`], within this value's deadline.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_any`](super::Session::recv_any): [`Error::Timeout`] names every
    /// peer still there.
    pub async fn recv_any(&self) -> Result<(u32, Vec<u8>), Error> {
        self.receiver.recv_any_within(self.timeout).await
    }
}

impl AsyncReceiver {
    /// [`Receiver::recv_any`], waiting as a task: the next message from any peer, round-robin,
    /// within the session's timeout.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_any`](super::Session::recv_any).
    pub async fn recv_any(&self) -> Result<(u32, Vec<u8>), Error> {
        self.recv_any_within(self.receiver.timeout()).await
    }

    /// This receiver, with `timeout` as the deadline of the receives made through the value
    /// returned, as [`Receiver::with_timeout`] gives one to a blocking receiver's. Rather than
    /// `tokio::time::timeout` around [`Self::recv_any`]: its [`Error::Timeout`] names every peer
    /// still there.
    #[must_use]
    pub fn with_timeout(&self, timeout: Duration) -> TimedAsyncReceiver<'_> {
        TimedAsyncReceiver {
            receiver: self,
            timeout,
        }
    }

    /// [`Self::recv_any`] with its own deadline.
    async fn recv_any_within(&self, timeout: Duration) -> Result<(u32, Vec<u8>), Error> {
        let wait = async {
            loop {
                if let Some(message) = self.receiver.try_recv_any()? {
                    return Ok(message);
                }
                let mut ready = self
                    .readiness
                    .readable()
                    .await
                    .map_err(|source| Error::Io {
                        what: "waiting for the readiness eventfd",
                        source,
                    })?;
                ready.clear_ready();
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(received) => received,
            // One last look, which also names the peers still there, as the blocking call does.
            Err(_elapsed) => match self.receiver.with_timeout(Duration::ZERO).recv_any() {
                Err(Error::Timeout {
                    op,
                    waiting_for,
                    diagnosis,
                    stopped,
                    ..
                }) => Err(Error::Timeout {
                    op,
                    waiting_for,
                    timeout,
                    diagnosis,
                    stopped,
                }),
                other => other,
            },
        }
    }

    /// The receiver, for its other calls (`try_recv`, `recv` from one peer, ...).
    #[must_use]
    pub fn receiver(&self) -> &Receiver {
        &self.receiver
    }

    /// The receiver back, its fd deregistered: for [`Sender::rejoin`](super::Sender::rejoin).
    #[must_use]
    pub fn into_inner(self) -> Receiver {
        self.receiver
    }
}
