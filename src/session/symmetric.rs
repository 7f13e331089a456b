//! Symmetric buffers: arrays that live in this rank's outbox, so that an all-reduce on them is
//! read by the peers where they lie, with no copy in.
//!
//! A [`Symmetric`] is a typed [`Loan`] its holder keeps.
//! [`Collectives::all_reduce`](crate::Collectives::all_reduce) (on the session or a group)
//! recognises data in a block of the outbox that this rank holds and lends it in place (see the
//! `reductions` module for why the peers are done reading before the call returns). Nothing else
//! changes: the other ranks need not use symmetric buffers, and a call that cannot lend in place (a
//! buffer still read after a failed call) lends a copy.

use super::state::Session;
use crate::error::Error;
use bytemuck::Pod;
use shmbroker_allocator::Loan;
use std::marker::PhantomData;

/// An array of `T` in this rank's outbox ([`Session::symmetric`]): an all-reduce on it is read
/// by the peers in place. It reads and writes as a `[T]`.
///
/// ```no_run
/// # fn run(session: &mut shmbroker::Session) -> Result<(), shmbroker::Error> {
/// use shmbroker::{Collectives, ReduceOp};
/// let mut gradients = session.symmetric::<f32>(1 << 22)?;
/// gradients.fill(0.5);
/// session.all_reduce(&mut gradients, ReduceOp::Sum)?;
/// assert!(session.reductions_read_in_place() > 0); // read where it lies, not copied
/// # Ok(()) }
/// ```
///
/// After an all-reduce on it fails, a peer may still be reading it (one stopped mid-call): what
/// this rank writes then can change what that peer's call computes, even what it returns as a
/// success. Write it again only once every peer's call has ended too (after the `shrink` or
/// `barrier` that follows, say), or drop it: dropping it while peers may still read it is safe,
/// as its block goes back to the outbox once they are done.
pub struct Symmetric<T> {
    loan: Loan,
    len: usize,
    element: PhantomData<T>,
}

impl<T> std::fmt::Debug for Symmetric<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symmetric")
            .field("len", &self.len)
            .field("loan", &self.loan)
            .finish()
    }
}

impl<T: Pod> Symmetric<T> {
    /// The loan holding the buffer, to send it to a peer by reference (its bytes as they are).
    #[must_use]
    pub fn into_loan(self) -> Loan {
        self.loan
    }
}

impl<T: Pod> std::ops::Deref for Symmetric<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // Outbox blocks start on 64-byte boundaries (the allocator's `ALIGN`), and the loan
        // is `len` whole elements long: `Session::symmetric` made it so.
        bytemuck::cast_slice(&self.loan[..self.len * size_of::<T>()])
    }
}

impl<T: Pod> std::ops::DerefMut for Symmetric<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let bytes = self.len * size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.loan[..bytes])
    }
}

impl Session {
    /// A zeroed array of `len` elements of `T` in this rank's outbox: an all-reduce on it
    /// ([`Collectives::all_reduce`](crate::Collectives::all_reduce), on the session or a group) is
    /// read by the peers where it lies, with no copy in (see [`Symmetric`]). It holds its outbox
    /// block until dropped, so the outbox must have room for it beside the session's other traffic.
    /// Waits, up to the session's deadline, as [`Self::loan`] does.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for an element type an outbox block is not aligned for (over 64
    /// bytes) or a size that overflows; otherwise as for [`Self::loan`].
    pub fn symmetric<T: Pod>(&mut self, len: usize) -> Result<Symmetric<T>, Error> {
        if align_of::<T>() > 64 || size_of::<T>() == 0 {
            return Err(Error::Misuse(format!(
                "a symmetric buffer holds elements of 1 to 64-byte alignment and a non-zero \
                 size, not {} (alignment {})",
                std::any::type_name::<T>(),
                align_of::<T>()
            )));
        }
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            Error::Misuse(format!(
                "a symmetric buffer of {len} elements of {} bytes is more than memory holds",
                size_of::<T>()
            ))
        })?;
        let mut loan = self.loan(bytes)?;
        loan.fill(0);
        Ok(Symmetric {
            loan,
            len,
            element: PhantomData,
        })
    }

    /// How many pieces of all-reduces this session lent where they lay (a [`Symmetric`] buffer
    /// or a loan), with no copy in: a way to check that a program's buffers are on that path.
    /// An all-reduce in one shot (up to [`ONE_SHOT_MAX_BYTES`](super::tuning::ONE_SHOT_MAX_BYTES), or up to
    /// [`LENT_ONE_SHOT_MAX_BYTES`](super::tuning::LENT_ONE_SHOT_MAX_BYTES) of all ranks' contributions together) has none; a
    /// larger one has one per [`PIECE_MAX_BYTES`](super::tuning::PIECE_MAX_BYTES) or part of it.
    #[must_use]
    pub fn reductions_read_in_place(&self) -> u64 {
        self.engine.read_in_place()
    }
}
