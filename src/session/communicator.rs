//! The collectives the world and every group share, written once. The world ([`Session`]) and
//! every group ([`GroupView`], from [`Session::on`]) get them from one trait, [`Collectives`], as
//! rsmpi's communicators get theirs from one set of traits.
//!
//! A communicator only says which team its calls run among (`on_team`); `collective` runs a
//! call among that team under a collective's deadline. That trait is sealed, so nothing outside
//! this crate implements [`Collectives`] or calls its plumbing. For a session the team is the
//! world; for a view it is the group, whose ranks, roots, blocks and counts are group ranks.
//! Errors name world ranks either way.
//!
//! Each method here is its collective's entry, as Open MPI's `*_decision_fixed.c` is: it checks
//! the arguments, asks `tuning` which algorithm runs, and runs it. The algorithms are session
//! methods of (team, deadline) in the modules that own them (`collectives`, `rooted`,
//! `exchange`, `reductions`). The flat and tree ones take the collective's number from the
//! entry; the others take their own (one a piece where they run in pieces, as `lend_blocks`,
//! `reduce_scatter_lent` and `reduce_among` do), and `pairwise_v` checks its own counts. So a
//! new collective built from algorithms there is one method here; one that needs an algorithm
//! of its own adds that algorithm in its module.
//!
//! Some collectives stay on the session alone, for the world: typed all-gathers
//! (`all_gather_pod`), loans, fd and GPU-handle exchange, and user reductions.

use super::groups::GroupView;
use super::reductions::Results;
use super::state::Session;
use super::teams::Team;
use super::tuning;
use crate::error::Error;
use crate::reduce::{DType, Element, ReduceOp, cast, cast_mut, check_op, combine, for_dtype};
use shmbroker_bindings::kind;

mod sealed {
    use crate::error::Error;
    use crate::session::state::{Deadline, Session};
    use crate::session::teams::Team;

    /// Proof that a call comes from `communicator`, the only module that can make one. A
    /// generic bound `C: Collectives` lets code outside this crate name the methods of this
    /// supertrait; needing a `Token` keeps it from calling them.
    #[derive(Clone, Copy, Debug)]
    pub struct Token(pub(super) ());

    /// Which team a communicator's calls run among. Sealed: the trait lives in a private
    /// module, so only this crate's communicators implement it, and its methods need a
    /// [`Token`], so only this crate calls them.
    pub trait Communicator {
        /// Runs `call` on the session among this communicator's team.
        fn on_team<R>(
            &mut self,
            token: Token,
            call: impl FnOnce(&mut Session, &Team) -> Result<R, Error>,
        ) -> Result<R, Error>;

        /// Runs `body` as the collective `op` among this communicator's team, under the
        /// collective's deadline (see `status::Session::collective_on`).
        #[inline]
        fn collective<R>(
            &mut self,
            token: Token,
            op: &'static str,
            body: impl FnOnce(&mut Session, &Team, &Deadline) -> Result<R, Error>,
        ) -> Result<R, Error> {
            self.on_team(token, |session, team| session.collective_on(team, op, body))
        }
    }
}

/// The token this module's calls to the sealed trait carry.
const TOKEN: sealed::Token = sealed::Token(());

/// The collectives of a communicator: the world (a [`Session`]) or a group (a [`GroupView`]).
/// Bring it into scope (`use shmbroker::Collectives;`) to call them.
///
/// Every call has the communicator's deadline: the session's ([`Session::set_timeout`]), or its
/// own through [`Session::with_timeout`] or [`GroupView::with_timeout`].
///
/// # Sealed
///
/// Only this crate's communicators implement it, and the plumbing they share is for this crate
/// alone, even through a generic bound:
///
/// ```compile_fail
/// use shmbroker::{Collectives, Error};
/// fn peek<C: Collectives>(comm: &mut C) -> Result<(), Error> {
///     comm.on_team(|_session, _team| Ok(()))
/// }
/// ```
pub trait Collectives: sealed::Communicator {
    /// Returns once every rank has entered the barrier.
    ///
    /// # Errors
    ///
    /// [`Error::PeerLost`], [`Error::Timeout`], [`Error::CollectiveMismatch`],
    /// [`Error::PeerGaveUp`] (a rank this call waits for failed its part and left it: every
    /// collective can fail so).
    fn barrier(&mut self) -> Result<(), Error> {
        self.collective(TOKEN, "barrier", |session, team, deadline| {
            let seq = session.next_seq(team, kind::BARRIER)?;
            match tuning::barrier(team.size()) {
                tuning::Barrier::Flat => session.flat_barrier(team, seq, deadline),
                tuning::Barrier::Dissemination => {
                    session.dissemination_barrier(team, seq, deadline)
                }
            }
        })
    }

    /// `root`'s data on every rank: the root passes `Some(data)`, the others `None`.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the root passes `None` or another rank `Some`; otherwise as for
    /// [`Self::all_gather`].
    fn broadcast(&mut self, root: u32, data: Option<&[u8]>) -> Result<Vec<u8>, Error> {
        self.collective(TOKEN, "broadcast", |session, team, deadline| {
            session.check_root(team, root, data.is_some(), "broadcast")?;
            let seq = session.next_seq(team, kind::BROADCAST)?;
            match tuning::broadcast(team.size()) {
                tuning::Rooted::Flat => session.flat_broadcast(team, root, data, seq, deadline),
                tuning::Rooted::Tree => session.tree_broadcast(team, root, data, seq, deadline),
            }
        })
    }

    /// Every rank's `data` (any size, sizes may differ) at `root`, indexed by rank: `Some` at the
    /// root, `None` elsewhere.
    ///
    /// # Errors
    ///
    /// As for [`Self::all_gather`], and [`Error::RankOutOfRange`] for a bad root.
    fn gather(&mut self, root: u32, data: &[u8]) -> Result<Option<Vec<Vec<u8>>>, Error> {
        self.collective(TOKEN, "gather", |session, team, deadline| {
            team.check_rank(root)?;
            let seq = session.next_seq(team, kind::GATHER)?;
            match tuning::gather(team.size()) {
                tuning::Rooted::Flat => session.flat_gather(team, root, data, seq, deadline),
                tuning::Rooted::Tree => session.tree_gather(team, root, data, seq, deadline),
            }
        })
    }

    /// The root's `input` cut into `world_size` equal blocks, block `r` into rank `r`'s `output`
    /// (as `MPI_Scatter`): the root passes `Some(input)` of `world_size * output.len()` bytes, the
    /// others `None`.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for a root without input (or another rank with one) or an input of
    /// another length; [`Error::Protocol`] naming the root when a block has another length;
    /// otherwise as for [`Self::broadcast`].
    fn scatter(&mut self, root: u32, input: Option<&[u8]>, output: &mut [u8]) -> Result<(), Error> {
        self.collective(TOKEN, "scatter", |session, team, deadline| {
            session.check_root(team, root, input.is_some(), "scatter")?;
            let seq = session.next_seq(team, kind::SCATTER)?;
            session.flat_scatter(team, root, input, output, seq, deadline)
        })
    }

    /// Every rank's `data` (any size, sizes may differ), indexed by rank.
    ///
    /// # Errors
    ///
    /// [`Error::PeerLost`], [`Error::Timeout`], [`Error::CollectiveMismatch`],
    /// [`Error::PeerGaveUp`], [`Error::Protocol`], [`Error::Outbox`].
    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        self.collective(TOKEN, "all_gather", |session, team, deadline| {
            session.all_gather_with(team, data, deadline)
        })
    }

    /// Every rank's `data`, all of one size, into `out` in rank order (`out` must hold exactly
    /// `world_size * data.len()` bytes), with no allocation per peer.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when `out` has another length; [`Error::Protocol`] when a peer's
    /// contribution has another size; otherwise as for [`Self::all_gather`].
    fn all_gather_into(&mut self, data: &[u8], out: &mut [u8]) -> Result<(), Error> {
        self.collective(TOKEN, "all_gather", |session, team, deadline| {
            let expected = data.len() * team.size() as usize;
            if out.len() != expected {
                return Err(Error::Misuse(format!(
                    "all_gather_into needs a buffer of {expected} bytes, got {}",
                    out.len()
                )));
            }
            let seq = session.next_seq(team, kind::ALL_GATHER)?;
            session.gather_parts_into(team, kind::ALL_GATHER, seq, data, out, deadline)
        })
    }

    /// Block `q` of `input` to rank `q`, and block `q` of `output` from rank `q` (as
    /// `MPI_Alltoall`): `input` and `output` hold `world_size` blocks of equal length.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when `input` and `output` differ in length or are not whole blocks;
    /// [`Error::Protocol`] naming a rank whose block has another length; otherwise as for
    /// [`Self::all_gather`].
    fn all_to_all(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), Error> {
        self.collective(TOKEN, "all_to_all", |session, team, deadline| {
            let world = team.size() as usize;
            if input.len() != output.len() || !input.len().is_multiple_of(world) {
                return Err(Error::Misuse(format!(
                    "all_to_all needs an input and an output of {world} equal blocks, got {} \
                     and {} bytes",
                    input.len(),
                    output.len()
                )));
            }
            match tuning::all_to_all(world, input.len() / world) {
                tuning::AllToAll::Lent => session.lend_blocks(team, input, output, deadline),
                tuning::AllToAll::Pairwise => {
                    let seq = session.next_seq(team, kind::ALL_TO_ALL)?;
                    session.exchange_blocks(team, kind::ALL_TO_ALL, seq, input, output, deadline)
                }
            }
        })
    }

    /// [`Self::all_to_all`] with a byte count per rank (as `MPI_Alltoallv`): `send_counts[q]`
    /// bytes of `input` go to rank `q`, in rank order, and `recv_counts[q]` bytes from rank `q`
    /// land in `output`, in rank order.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the counts are not one per rank or do not add up to the buffers'
    /// lengths; [`Error::Protocol`] naming a rank that sent another count than this rank expects;
    /// otherwise as for [`Self::all_gather`].
    fn all_to_all_v(
        &mut self,
        input: &[u8],
        send_counts: &[usize],
        output: &mut [u8],
        recv_counts: &[usize],
    ) -> Result<(), Error> {
        self.collective(TOKEN, "all_to_all_v", |session, team, deadline| {
            session.pairwise_v(team, input, send_counts, output, recv_counts, deadline)
        })
    }

    /// Combines every rank's `data` with `op`, in rank order, into every rank's `data` (in
    /// place, as `MPI_Allreduce` with `MPI_IN_PLACE`). Every rank passes as many elements.
    ///
    /// ```no_run
    /// # fn run(session: &mut shmbroker::Session) -> Result<(), shmbroker::Error> {
    /// use shmbroker::{Collectives, ReduceOp};
    /// let mut activations = vec![1.0f32; 4096];
    /// session.all_reduce(&mut activations, ReduceOp::Sum)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for an operation not defined for `T` (`Avg` of integers, bitwise
    /// operations of floats); [`Error::Protocol`] naming a rank that passed another length;
    /// otherwise as for [`Self::all_gather`].
    fn all_reduce<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<(), Error> {
        self.collective(TOKEN, "all_reduce", |session, team, deadline| {
            session.reduce_among(team, Results::All, data, op, deadline)
        })
    }

    /// [`Self::all_reduce`] of `input` into `output` (of the same length); `input` is unchanged.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the lengths differ; otherwise as for [`Self::all_reduce`].
    fn all_reduce_into<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.on_team(TOKEN, |session, team| {
            if input.len() != output.len() {
                return Err(Error::Misuse(format!(
                    "all_reduce_into needs an output as long as its input ({} elements), got {}",
                    input.len(),
                    output.len()
                )));
            }
            output.copy_from_slice(input);
            session.collective_on(team, "all_reduce", |session, team, deadline| {
                session.reduce_among(team, Results::All, output, op, deadline)
            })
        })
    }

    /// [`Self::all_reduce`] of bytes holding elements of `dtype` (for the C ABI and Python).
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when `data` is not whole elements of `dtype`, aligned for them;
    /// otherwise as for [`Self::all_reduce`].
    fn all_reduce_bytes(
        &mut self,
        data: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), Error> {
        for_dtype!(dtype, T => self.all_reduce(cast_mut::<T>(data)?, op))
    }

    /// Combines every rank's `data` with `op`, in rank order, into the root's `data`; the other
    /// ranks' `data` is unchanged (as `MPI_Reduce`).
    ///
    /// # Errors
    ///
    /// As for [`Self::all_reduce`], and [`Error::RankOutOfRange`] for the root.
    fn reduce<T: Element>(&mut self, root: u32, data: &mut [T], op: ReduceOp) -> Result<(), Error> {
        self.collective(TOKEN, "reduce", |session, team, deadline| {
            team.check_rank(root)?;
            session.reduce_among(team, Results::Root(root), data, op, deadline)
        })
    }

    /// [`Self::reduce`] of bytes holding elements of `dtype` (for the C ABI and Python).
    ///
    /// # Errors
    ///
    /// As for [`Self::all_reduce_bytes`] and [`Self::reduce`].
    fn reduce_bytes(
        &mut self,
        root: u32,
        data: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), Error> {
        for_dtype!(dtype, T => self.reduce(root, cast_mut::<T>(data)?, op))
    }

    /// Combines every rank's `input` with `op`, in rank order, and gives rank `r` block `r` of the
    /// result in `output` (as `MPI_Reduce_scatter_block`): `input` holds `world_size` blocks of
    /// `output.len()` elements.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when `input` is not `world_size * output.len()` elements; otherwise as
    /// for [`Self::all_reduce`].
    fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.collective(TOKEN, "reduce_scatter", |session, team, deadline| {
            check_op::<T>(op)?;
            let world = team.size() as usize;
            if input.len() != output.len() * world {
                return Err(Error::Misuse(format!(
                    "reduce_scatter needs an input of {world} blocks of the output's {} \
                     elements, got {} elements",
                    output.len(),
                    input.len()
                )));
            }
            if world == 1 {
                output.copy_from_slice(input);
                return combine(op, &[input], output);
            }
            if tuning::reduce_scatter_exchanges(size_of_val(input)) {
                return session.reduce_scatter_exchanged(team, input, output, op, deadline);
            }
            session.reduce_scatter_lent(team, input, output, op, deadline)
        })
    }

    /// [`Self::reduce_scatter`] of bytes holding elements of `dtype` (for the C ABI and Python).
    ///
    /// # Errors
    ///
    /// As for [`Self::all_reduce_bytes`] and [`Self::reduce_scatter`].
    fn reduce_scatter_bytes(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), Error> {
        for_dtype!(dtype, T => self.reduce_scatter(cast::<T>(input)?, cast_mut::<T>(output)?, op))
    }
}

impl sealed::Communicator for Session {
    fn on_team<R>(
        &mut self,
        _: sealed::Token,
        call: impl FnOnce(&mut Session, &Team) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let world = self.groups.world().clone();
        call(self, &world)
    }
}

impl Collectives for Session {}

impl sealed::Communicator for GroupView<'_> {
    fn on_team<R>(
        &mut self,
        _: sealed::Token,
        call: impl FnOnce(&mut Session, &Team) -> Result<R, Error>,
    ) -> Result<R, Error> {
        self.run(call)
    }
}

impl Collectives for GroupView<'_> {}
