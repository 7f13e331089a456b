//! Typed channels: a dedicated ring of fixed-size records from one rank to another.
//!
//! A session's rings carry every kind of message between two ranks, framed, numbered and
//! acknowledged; a scheduler that streams small fixed records to its workers pays for all of that
//! on every record. A channel is a ring of its own, made on demand, that carries nothing but
//! records of one size: sending one is the ring's own `try_send` of a slot.
//!
//! # Making one
//!
//! Both ends call: the producer [`Session::channel_to`] (or [`Session::raw_channel_to`] for a
//! record known by its size), the consumer [`Session::channel_from`], with the same type tag. The
//! producer asks the broker for the ring (a [`NoticeKind::ChannelRequest`] naming the record's
//! size, the ring's capacity and the channel's number between the two ranks); the broker makes a
//! ring of slots of the record's *class* (the power of two of at least 8 bytes that holds it) in
//! a sealed memfd and passes it to both, as it passes the session's rings at logon. So neither end
//! made the file the other maps, and joining it checks it as every ring is checked.
//!
//! Then the producer sends a first record of its own, its type tag, and the consumer checks it
//! and the record's size (which the broker's notice carries) against its own. On a mismatch the
//! consumer's call fails saying what each end has, and it closes the ring: the producer's next
//! call fails with [`Error::ChannelClosed`].
//!
//! [`NoticeKind::ChannelRequest`]: shmbroker_bindings::NoticeKind::ChannelRequest
//!
//! # Using one
//!
//! The producer has `try_send`, `send` (waiting for room within its deadline) and `send_batch`;
//! the consumer `try_recv`, `recv` and `recv_batch`. They wait as the session's rings do (spin,
//! yield, then sleep on the ring's futex), in slices of [`LOOK_EVERY`], between which they look
//! whether the other end's process is still there and whether an interrupt came. So a dead peer
//! is [`Error::PeerLost`] within a slice (the consumer first receives what it sent), an
//! interrupt is [`Error::Interrupted`], and the deadline is [`Error::Timeout`] naming the peer.
//! Dropping an end closes the channel: the other end receives what was sent, then gets
//! [`Error::ChannelClosed`].
//!
//! Each end is one thread's (`Send`, not `Sync`): the ring has one producer and one consumer, and
//! neither touches the session, which goes on with its own calls meanwhile.

use super::membership::departure_error;
use super::state::Session;
use crate::error::Error;
use bytemuck::{Pod, Zeroable};
use shmbroker_bindings::ChannelToken;
use shmbroker_handshake::PeerWatch;
use shmbroker_queues::{
    Consumer, Producer, RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError,
};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// How long a wait for room or for a record sleeps at most before it looks whether the other
/// end's process is still there, and whether an interrupt came.
pub const LOOK_EVERY: Duration = Duration::from_millis(10);

/// The cause a consumer closes a channel with when the producer's tag or record size is not its
/// own (read by the producer's next call).
const MISMATCH: u32 = 1;

macro_rules! classes {
    ($($name:ident $variant:ident $bytes:literal),* $(,)?) => {
        $(
            /// A record slot of one class.
            #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
            #[repr(C, align(8))]
            struct $name([u8; $bytes]);
        )*

        /// A channel's producer, for its record class.
        enum Tx {
            $($variant(Producer<$name>),)*
        }

        /// A channel's consumer, for its record class.
        enum Rx {
            $($variant(Consumer<$name>),)*
        }

        impl Tx {
            fn join(class: u32, fd: std::os::fd::BorrowedFd<'_>) -> Result<Self, shmbroker_queues::Error> {
                match class {
                    $($bytes => Ok(Self::$variant(Producer::join(fd)?)),)*
                    _ => unreachable!("a class is a power of two from 8 to 4096"),
                }
            }
        }

        impl Rx {
            fn join(class: u32, fd: std::os::fd::BorrowedFd<'_>) -> Result<Self, shmbroker_queues::Error> {
                match class {
                    $($bytes => Ok(Self::$variant(Consumer::join(fd)?)),)*
                    _ => unreachable!("a class is a power of two from 8 to 4096"),
                }
            }
        }

        /// Runs `$body` with `$ring` bound to the producer or consumer of whatever class, and
        /// `$slot` to that class's slot type.
        macro_rules! with_class {
            ($enum:ident, $value:expr, |$ring:ident, $slot:ident| $body:expr) => {
                match $value {
                    $($enum::$variant($ring) => {
                        #[allow(dead_code)]
                        type $slot = $name;
                        $body
                    })*
                }
            };
        }

        /// Slots of each class copied at a time through the stack ([`SCRATCH_BYTES`] of them).
        trait Batch {
            const SLOTS: usize;
        }
        $(impl Batch for $name {
            const SLOTS: usize = SCRATCH_BYTES / $bytes;
        })*
    };
}

classes! {
    C8 B8 8, C16 B16 16, C32 B32 32, C64 B64 64, C128 B128 128, C256 B256 256,
    C512 B512 512, C1024 B1024 1024, C2048 B2048 2048, C4096 B4096 4096,
}

/// What both ends of a channel know about it.
#[derive(Debug)]
struct Ends {
    peer: u32,
    number: u64,
    record: usize,
    watch: PeerWatch,
    /// The deadline of calls that wait.
    timeout: Duration,
}

impl Ends {
    /// The error for a ring the other end closed. Only an end that is dropped closes it (a
    /// process that dies leaves it open, and is seen gone between waits), so this is the
    /// channel closing, whether or not the other end's session has gone since; or, closed with
    /// [`MISMATCH`] by a consumer, its refusal.
    fn closed(&self, direction: &'static str, cause: Option<u32>) -> Error {
        if cause == Some(MISMATCH) {
            return Error::Misuse(format!(
                "rank {} refused channel #{} from this rank: its type tag or record size is not \
                 this end's ({} bytes; its error says what it expected)",
                self.peer, self.number, self.record
            ));
        }
        Error::ChannelClosed {
            peer: self.peer,
            number: self.number,
            direction,
        }
    }

    fn corrupted(&self, corruption: shmbroker_queues::Corruption) -> Error {
        Error::Corrupted {
            peer: self.peer,
            corruption,
        }
    }

    /// After a slice of waiting: the error that ends the wait, if any. Only the other end's
    /// process dying ends it for that end: a channel end outlives its session (its session
    /// leaving closes the session's rings, not the channel's).
    fn look(&self, op: &'static str, started: Instant, interrupts: u64) -> Option<Error> {
        if self.watch.is_dead(self.peer) {
            return Some(self.watch.departure(self.peer).map_or_else(
                || Error::PeerLost {
                    rank: self.peer,
                    diagnosis: Vec::new(),
                },
                departure_error,
            ));
        }
        if self.watch.interrupt_count() != interrupts {
            return Some(Error::Interrupted);
        }
        (started.elapsed() >= self.timeout).then(|| Error::Timeout {
            op,
            waiting_for: vec![self.peer],
            timeout: self.timeout,
            diagnosis: Vec::new(),
            stopped: None,
        })
    }

    /// The time left to wait in a slice from `started`.
    fn slice(&self, started: Instant) -> Duration {
        LOOK_EVERY.min(self.timeout.saturating_sub(started.elapsed()))
    }

    fn check_record(&self, len: usize) -> Result<(), Error> {
        if len != self.record {
            return Err(Error::Misuse(format!(
                "a record of {len} bytes: channel #{} carries records of {} bytes",
                self.number, self.record
            )));
        }
        Ok(())
    }

    fn check_len(&self, len: usize, what: &str) -> Result<usize, Error> {
        if !len.is_multiple_of(self.record) {
            return Err(Error::Misuse(format!(
                "{what} of {len} bytes: channel #{} carries records of {} bytes",
                self.number, self.record
            )));
        }
        Ok(len / self.record)
    }
}

// The operations on a ring of slots `S`, with a channel's errors: the typed ends run them on
// their records themselves when those fill their slots, the raw ends on their class's slots.

/// Sends what of `slots` fits now; how many went.
fn try_send_slots<S: Pod>(
    ring: &mut Producer<S>,
    ends: &Ends,
    slots: &[S],
) -> Result<usize, Error> {
    let went = if let [slot] = slots {
        ring.try_send(*slot).map(|()| 1).map_err(|e| match e {
            TrySendError::Full(_) => TrySendError::Full(()),
            TrySendError::Disconnected(_) => TrySendError::Disconnected(()),
            TrySendError::Corrupted(_, c) => TrySendError::Corrupted((), c),
        })
    } else {
        ring.try_send_batch(slots)
    };
    match went {
        Ok(n) => Ok(n),
        Err(TrySendError::Full(())) => Ok(0),
        Err(TrySendError::Disconnected(())) => Err(ends.closed("from", ring.close_cause())),
        Err(TrySendError::Corrupted((), corruption)) => Err(ends.corrupted(corruption)),
    }
}

/// Sends every one of `slots`, waiting for room within the channel's deadline.
fn send_slots<S: Pod>(ring: &mut Producer<S>, ends: &Ends, slots: &[S]) -> Result<(), Error> {
    let mut sent = try_send_slots(ring, ends, slots)?;
    if sent == slots.len() {
        return Ok(());
    }
    let started = Instant::now();
    let interrupts = ends.watch.interrupt_count();
    while sent < slots.len() {
        match ring.send_timeout(slots[sent], ends.slice(started)) {
            Ok(()) => sent += 1 + try_send_slots(ring, ends, &slots[sent + 1..])?,
            Err(SendTimeoutError::Timeout(_)) => {
                if let Some(error) = ends.look("channel send", started, interrupts) {
                    return Err(error);
                }
            }
            Err(SendTimeoutError::Disconnected(_)) => {
                return Err(ends.closed("from", ring.close_cause()));
            }
            Err(SendTimeoutError::Corrupted(_, corruption)) => {
                return Err(ends.corrupted(corruption));
            }
        }
    }
    Ok(())
}

/// Receives into `out` what has arrived, up to its length; how many. Once the producer closed
/// the channel, what it sent comes first.
fn try_recv_slots<S: Pod>(
    ring: &mut Consumer<S>,
    ends: &Ends,
    out: &mut [S],
) -> Result<usize, Error> {
    let got = if let [slot] = out {
        ring.try_recv().map(|received| {
            *slot = received;
            1
        })
    } else {
        ring.try_recv_batch(out)
    };
    match got {
        Ok(n) => Ok(n),
        Err(TryRecvError::Empty) => Ok(0),
        Err(TryRecvError::Disconnected) => Err(ends.closed("to", None)),
        Err(TryRecvError::Corrupted(corruption)) => Err(ends.corrupted(corruption)),
    }
}

/// Receives into `out` what has arrived, up to its length, waiting for the first within the
/// channel's deadline; how many (at least 1 unless `out` is empty).
fn recv_slots<S: Pod>(ring: &mut Consumer<S>, ends: &Ends, out: &mut [S]) -> Result<usize, Error> {
    let got = try_recv_slots(ring, ends, out)?;
    if got > 0 || out.is_empty() {
        return Ok(got);
    }
    let started = Instant::now();
    let interrupts = ends.watch.interrupt_count();
    loop {
        match ring.recv_timeout(ends.slice(started)) {
            Ok(slot) => {
                out[0] = slot;
                // What else has arrived; a close or a corruption after it shows on the next
                // call, so that the record in hand is not lost with it.
                return Ok(1 + try_recv_slots(ring, ends, &mut out[1..]).unwrap_or(0));
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Interrupted) => {
                if let Some(error) = ends.look("channel recv", started, interrupts) {
                    return Err(error);
                }
            }
            Err(RecvTimeoutError::Disconnected) => return Err(ends.closed("to", None)),
            Err(RecvTimeoutError::Corrupted(corruption)) => return Err(ends.corrupted(corruption)),
        }
    }
}

/// The first slot a producer sends: its type tag in the first 8 bytes.
fn hello<S: Pod>(tag: u64) -> S {
    let mut slot = S::zeroed();
    bytemuck::bytes_of_mut(&mut slot)[..8].copy_from_slice(&tag.to_le_bytes());
    slot
}

/// The sending end of a channel of records known by their size (see the module docs); the C
/// and Python bindings' channels. [`ChannelSender`] is this for a `Pod` type.
pub struct RawChannelSender {
    ring: Tx,
    ends: Ends,
}

/// The receiving end of a channel of records known by their size.
pub struct RawChannelReceiver {
    ring: Rx,
    ends: Ends,
}

impl std::fmt::Debug for RawChannelSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RawChannelSender(to rank {}, #{}, {} B records)",
            self.ends.peer, self.ends.number, self.ends.record
        )
    }
}

impl std::fmt::Debug for RawChannelReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RawChannelReceiver(from rank {}, #{}, {} B records)",
            self.ends.peer, self.ends.number, self.ends.record
        )
    }
}

/// Bytes of slots copied at a time through the stack.
const SCRATCH_BYTES: usize = 4096;

/// Stack room for slots of any class, aligned as they are.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(8))]
struct Scratch([u8; SCRATCH_BYTES]);

/// Copies `record` into the front of a zeroed slot of class `S`.
fn slot_of<S: Pod>(record: &[u8]) -> S {
    let mut slot = S::zeroed();
    bytemuck::bytes_of_mut(&mut slot)[..record.len()].copy_from_slice(record);
    slot
}

/// Sends `records` (whole records of `record` bytes) on `ring`, as slots of `S`: from where
/// they are when they fill their slots and are aligned as slots are, else copied into slots a
/// stack's worth at a time. `wait`: for room, within the deadline; or only what fits now.
/// Returns how many went.
fn send_records<S: Pod + Batch>(
    ring: &mut Producer<S>,
    ends: &Ends,
    records: &[u8],
    wait: bool,
) -> Result<usize, Error> {
    let record = ends.record;
    if record == size_of::<S>()
        && let Ok(slots) = bytemuck::try_cast_slice::<u8, S>(records)
    {
        return if wait {
            send_slots(ring, ends, slots).map(|()| slots.len())
        } else {
            try_send_slots(ring, ends, slots)
        };
    }
    let count = records.len() / record;
    if count == 1 {
        let slot: S = slot_of(records);
        return if wait {
            send_slots(ring, ends, &[slot]).map(|()| 1)
        } else {
            try_send_slots(ring, ends, &[slot])
        };
    }
    let mut scratch = Scratch([0; SCRATCH_BYTES]);
    let mut sent = 0;
    while sent < count {
        let take = (count - sent).min(S::SLOTS);
        let slots: &mut [S] = bytemuck::cast_slice_mut(&mut scratch.0[..take * size_of::<S>()]);
        for (slot, bytes) in slots
            .iter_mut()
            .zip(records[sent * record..].chunks_exact(record))
        {
            *slot = slot_of(bytes);
        }
        if wait {
            send_slots(ring, ends, slots)?;
            sent += take;
        } else {
            let went = try_send_slots(ring, ends, slots)?;
            sent += went;
            if went < take {
                break;
            }
        }
    }
    Ok(sent)
}

/// Receives into `records` (room for whole records) as [`send_records`] sends: `wait` for the
/// first within the deadline, or not. Returns how many.
fn recv_records<S: Pod + Batch>(
    ring: &mut Consumer<S>,
    ends: &Ends,
    records: &mut [u8],
    wait: bool,
) -> Result<usize, Error> {
    let record = ends.record;
    if record == size_of::<S>()
        && let Ok(slots) = bytemuck::try_cast_slice_mut::<u8, S>(records)
    {
        return if wait {
            recv_slots(ring, ends, slots)
        } else {
            try_recv_slots(ring, ends, slots)
        };
    }
    let count = records.len() / record;
    if count == 1 {
        let mut slot = [S::zeroed()];
        let got = if wait {
            recv_slots(ring, ends, &mut slot)?
        } else {
            try_recv_slots(ring, ends, &mut slot)?
        };
        if got == 1 {
            records.copy_from_slice(&bytemuck::bytes_of(&slot[0])[..record]);
        }
        return Ok(got);
    }
    let mut scratch = Scratch([0; SCRATCH_BYTES]);
    let want = count.min(S::SLOTS);
    let slots: &mut [S] = bytemuck::cast_slice_mut(&mut scratch.0[..want * size_of::<S>()]);
    let got = if wait {
        recv_slots(ring, ends, slots)?
    } else {
        try_recv_slots(ring, ends, slots)?
    };
    for (bytes, slot) in records.chunks_exact_mut(record).zip(&slots[..got]) {
        bytes.copy_from_slice(&bytemuck::bytes_of(slot)[..record]);
    }
    Ok(got)
}

impl RawChannelSender {
    /// The rank at the other end.
    #[must_use]
    pub fn peer(&self) -> u32 {
        self.ends.peer
    }

    /// Bytes per record.
    #[must_use]
    pub fn record_bytes(&self) -> usize {
        self.ends.record
    }

    /// Sends the records in `records` (a whole number of them) that the ring has room for now;
    /// returns how many went.
    ///
    /// # Errors
    ///
    /// [`Error::ChannelClosed`] once the consumer closed the channel, [`Error::Misuse`] once it
    /// refused it (its tag or record size is not this end's) or for a length that is not a
    /// whole number of records.
    pub fn try_send_batch(&mut self, records: &[u8]) -> Result<usize, Error> {
        self.ends.check_len(records.len(), "a batch")?;
        let ends = &self.ends;
        with_class!(Tx, &mut self.ring, |ring, Slot| send_records(
            ring, ends, records, false
        ))
    }

    /// Sends one record if the ring has room now: `false` if not.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_send_batch`].
    pub fn try_send(&mut self, record: &[u8]) -> Result<bool, Error> {
        self.ends.check_record(record.len())?;
        self.try_send_batch(record).map(|sent| sent == 1)
    }

    /// Sends one record, waiting for room within the channel's deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_send_batch`], and, while it waits for room, [`Error::Timeout`],
    /// [`Error::Interrupted`], and [`Error::PeerLost`] once the consumer's process is gone.
    pub fn send(&mut self, record: &[u8]) -> Result<(), Error> {
        self.ends.check_record(record.len())?;
        self.send_batch(record)
    }

    /// Sends every record of `records`, waiting for room as it needs within the channel's
    /// deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::send`]; the records before the one that failed went.
    pub fn send_batch(&mut self, records: &[u8]) -> Result<(), Error> {
        self.ends.check_len(records.len(), "a batch")?;
        let ends = &self.ends;
        with_class!(Tx, &mut self.ring, |ring, Slot| send_records(
            ring, ends, records, true
        ))
        .map(drop)
    }
}

impl RawChannelReceiver {
    /// The rank at the other end.
    #[must_use]
    pub fn peer(&self) -> u32 {
        self.ends.peer
    }

    /// Bytes per record.
    #[must_use]
    pub fn record_bytes(&self) -> usize {
        self.ends.record
    }

    /// Receives into `records` (a whole number of records long) as many as have arrived, up to
    /// its length, without waiting; returns how many.
    ///
    /// # Errors
    ///
    /// [`Error::ChannelClosed`] once the producer closed the channel and everything it sent was
    /// received; [`Error::Misuse`] for a length that is not a whole number of records.
    pub fn try_recv_batch(&mut self, records: &mut [u8]) -> Result<usize, Error> {
        self.ends.check_len(records.len(), "a buffer")?;
        let ends = &self.ends;
        with_class!(Rx, &mut self.ring, |ring, Slot| recv_records(
            ring, ends, records, false
        ))
    }

    /// Receives one record into `record` if one has arrived: `false` if none.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_recv_batch`].
    pub fn try_recv(&mut self, record: &mut [u8]) -> Result<bool, Error> {
        self.ends.check_record(record.len())?;
        self.try_recv_batch(record).map(|got| got == 1)
    }

    /// Receives one record, waiting for it within the channel's deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_recv_batch`], and, while it waits, [`Error::Timeout`],
    /// [`Error::Interrupted`], and [`Error::PeerLost`] once the producer's process is gone and
    /// everything it sent was received.
    pub fn recv(&mut self, record: &mut [u8]) -> Result<(), Error> {
        self.ends.check_record(record.len())?;
        self.recv_batch(record).map(drop)
    }

    /// Receives into `records` the records that have arrived, up to its length, waiting for
    /// the first within the channel's deadline; returns how many (at least 1).
    ///
    /// # Errors
    ///
    /// As for [`Self::recv`].
    pub fn recv_batch(&mut self, records: &mut [u8]) -> Result<usize, Error> {
        self.ends.check_len(records.len(), "a buffer")?;
        let ends = &self.ends;
        with_class!(Rx, &mut self.ring, |ring, Slot| recv_records(
            ring, ends, records, true
        ))
    }
}

/// A typed end's ring: its records' own when they fill their slots exactly and are aligned as
/// slots are (no copy into a slot, no class to choose), else the raw end's.
enum Typed<End, Raw> {
    Direct(End, Ends),
    Raw(Raw),
}

/// The sending end of a channel of `T` records ([`Session::channel_to`]).
pub struct ChannelSender<T: Pod> {
    end: Typed<Producer<T>, RawChannelSender>,
}

/// The receiving end of a channel of `T` records ([`Session::channel_from`]).
pub struct ChannelReceiver<T: Pod> {
    end: Typed<Consumer<T>, RawChannelReceiver>,
}

/// The smallest record whose channel gives its ring's slots back in batches of up to
/// [`RELEASE_BATCH`] (`Consumer::set_release_batch`, which says how). A consumer a little slower
/// than its producer lets the ring fill; then each slot given back alone costs a round trip
/// between the cores, and the stream settles at one record per round trip. With 64-byte
/// records on the 2-vCPU guests `channel_stream` runs on, a typed receiver giving back every
/// slot took 15.7-16.6 M records a second, one taking ahead what had arrived (its read-ahead
/// until then) 21-27 M, and one giving back in batches of 16 to 128 42-48 M (the raw ring in the
/// same runs: 12-54 M, as it fell into one regime or the other). At 8 bytes batches did not pay
/// (about 37 M against 55 to 79 M): the extra look at the next slot costs more than the round
/// trips it saves.
const RELEASE_BATCH_MIN_RECORD: usize = 64;

/// The most slots a channel's receiver keeps before it gives them back, while the next record
/// is already there (at most a quarter of the ring): what its producer may see as missing room
/// while the receiver holds unread records. 16, 32 and 128 measured alike (42-48 M at 64 bytes).
const RELEASE_BATCH: usize = 32;

/// Gives `ring`'s slots back in batches when its records are large enough to gain from it.
fn batch_releases<S: Pod>(ring: &mut Consumer<S>, record_bytes: usize) {
    if record_bytes >= RELEASE_BATCH_MIN_RECORD {
        ring.set_release_batch(RELEASE_BATCH);
    }
}

impl<T: Pod> std::fmt::Debug for ChannelSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.end {
            Typed::Direct(_, ends) => {
                write!(f, "ChannelSender(to rank {}, #{})", ends.peer, ends.number)
            }
            Typed::Raw(raw) => raw.fmt(f),
        }
    }
}

impl<T: Pod> std::fmt::Debug for ChannelReceiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.end {
            Typed::Direct(_, ends) => {
                write!(
                    f,
                    "ChannelReceiver(from rank {}, #{})",
                    ends.peer, ends.number
                )
            }
            Typed::Raw(raw) => raw.fmt(f),
        }
    }
}

impl<T: Pod> ChannelSender<T> {
    /// The rank at the other end.
    #[must_use]
    pub fn peer(&self) -> u32 {
        match &self.end {
            Typed::Direct(_, ends) => ends.peer,
            Typed::Raw(raw) => raw.peer(),
        }
    }

    /// Sends `record` if the ring has room now: `false` if not.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelSender::try_send_batch`].
    #[inline]
    pub fn try_send(&mut self, record: &T) -> Result<bool, Error> {
        match &mut self.end {
            // The ring's own call, and an error made only when there is one: this is the hot
            // path of a stream.
            Typed::Direct(ring, ends) => match ring.try_send(*record) {
                Ok(()) => Ok(true),
                Err(TrySendError::Full(_)) => Ok(false),
                Err(_) => Err(send_failed(ring, ends, record)),
            },
            Typed::Raw(raw) => raw.try_send(bytemuck::bytes_of(record)),
        }
    }

    /// Sends `record`, waiting for room within the deadline.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelSender::send`].
    pub fn send(&mut self, record: &T) -> Result<(), Error> {
        self.send_batch(std::slice::from_ref(record))
    }

    /// Sends as many of `records` as the ring has room for now; returns how many.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelSender::try_send_batch`].
    #[inline]
    pub fn try_send_batch(&mut self, records: &[T]) -> Result<usize, Error> {
        match &mut self.end {
            Typed::Direct(ring, ends) => try_send_slots(ring, ends, records),
            Typed::Raw(raw) => raw.try_send_batch(bytemuck::cast_slice(records)),
        }
    }

    /// Sends every record of `records`, waiting for room as it needs.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelSender::send_batch`].
    pub fn send_batch(&mut self, records: &[T]) -> Result<(), Error> {
        match &mut self.end {
            Typed::Direct(ring, ends) => send_slots(ring, ends, records),
            Typed::Raw(raw) => raw.send_batch(bytemuck::cast_slice(records)),
        }
    }
}

impl<T: Pod> ChannelReceiver<T> {
    /// The rank at the other end.
    #[must_use]
    pub fn peer(&self) -> u32 {
        match &self.end {
            Typed::Direct(_, ends) => ends.peer,
            Typed::Raw(raw) => raw.peer(),
        }
    }

    /// The next record if one has arrived.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelReceiver::try_recv_batch`].
    #[inline]
    pub fn try_recv(&mut self) -> Result<Option<T>, Error> {
        match &mut self.end {
            // As `ChannelSender::try_send`: the ring's own call on the hot path.
            Typed::Direct(ring, ends) => match ring.try_recv() {
                Ok(record) => Ok(Some(record)),
                Err(TryRecvError::Empty) => Ok(None),
                Err(_) => Err(recv_failed(ring, ends)),
            },
            Typed::Raw(raw) => {
                let mut record = T::zeroed();
                let got = raw.try_recv(bytemuck::bytes_of_mut(&mut record))?;
                Ok(got.then_some(record))
            }
        }
    }

    /// The next record, waiting for it within the deadline.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelReceiver::recv`].
    pub fn recv(&mut self) -> Result<T, Error> {
        let mut record = T::zeroed();
        self.recv_batch(std::slice::from_mut(&mut record))?;
        Ok(record)
    }

    /// Records that have arrived, into `records`, up to its length; how many.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelReceiver::try_recv_batch`].
    #[inline]
    pub fn try_recv_batch(&mut self, records: &mut [T]) -> Result<usize, Error> {
        match &mut self.end {
            Typed::Direct(ring, ends) => try_recv_slots(ring, ends, records),
            Typed::Raw(raw) => raw.try_recv_batch(bytemuck::cast_slice_mut(records)),
        }
    }

    /// Records that have arrived, into `records`, waiting for the first; how many.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelReceiver::recv_batch`].
    pub fn recv_batch(&mut self, records: &mut [T]) -> Result<usize, Error> {
        match &mut self.end {
            Typed::Direct(ring, ends) => recv_slots(ring, ends, records),
            Typed::Raw(raw) => raw.recv_batch(bytemuck::cast_slice_mut(records)),
        }
    }
}

/// The error of a typed end's send that found the ring closed or corrupted (once: the
/// ring's own `try_send` said so), by the general path.
#[cold]
fn send_failed<T: Pod>(ring: &mut Producer<T>, ends: &Ends, record: &T) -> Error {
    match try_send_slots(ring, ends, std::slice::from_ref(record)) {
        Err(error) => error,
        Ok(_) => ends.closed("from", ring.close_cause()),
    }
}

/// As [`send_failed`], for a receive.
#[cold]
fn recv_failed<T: Pod>(ring: &mut Consumer<T>, ends: &Ends) -> Error {
    let mut record = [T::zeroed()];
    match try_recv_slots(ring, ends, &mut record) {
        Err(error) => error,
        Ok(_) => ends.closed("to", None),
    }
}

/// Whether a channel of `T` records uses `T` as its slots: `T` fills its class exactly and is
/// aligned as the broker's slots are.
fn direct<T>() -> bool {
    let record = size_of::<T>() as u32;
    ChannelToken::class_bytes(record) == record && align_of::<T>() == 8
}

/// A channel's ring as the broker made it, before an end joins it.
struct Made {
    fd: std::os::fd::OwnedFd,
    ends: Ends,
    class: u32,
    /// What the producer asked for (for the consumer's checks).
    offered: ChannelToken,
}

fn join_error(source: shmbroker_queues::Error) -> Error {
    Error::Io {
        what: "joining a channel's ring the broker made",
        source: std::io::Error::other(source),
    }
}

impl Session {
    /// Makes channel of `T` records from this rank to `peer`, holding `capacity` of them (a
    /// power of two from 2 to 2^20). `peer` calls [`Self::channel_from`] with the same `tag`
    /// (any number the two agree on; a different one fails there). Calls that wait have this
    /// session's deadline as it is now.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for a `T` of more than 4096 bytes or aligned to more than 8, a bad
    /// capacity, a `peer` out of range or this rank; [`Error::Relay`] when the broker made no
    /// ring (`peer` is not logged on or holds as many fds it has not taken as it may);
    /// [`Error::Timeout`]; [`Error::BrokerLost`].
    pub fn channel_to<T: Pod>(
        &mut self,
        peer: u32,
        tag: u64,
        capacity: usize,
    ) -> Result<ChannelSender<T>, Error> {
        check_type::<T>()?;
        let made = self.ring_to(peer, size_of::<T>(), capacity)?;
        if !direct::<T>() {
            return Ok(ChannelSender {
                end: Typed::Raw(open_raw_sender(made, tag)?),
            });
        }
        let mut ring = Producer::<T>::join(made.fd.as_fd()).map_err(join_error)?;
        if try_send_slots(&mut ring, &made.ends, &[hello::<T>(tag)])? != 1 {
            return Err(made.ends.closed("from", ring.close_cause()));
        }
        Ok(ChannelSender {
            end: Typed::Direct(ring, made.ends),
        })
    }

    /// The channel of `T` records `peer` makes to this rank with [`Self::channel_to`] and
    /// `tag` (its next one to this rank), waiting for it within this session's deadline.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when `peer`'s tag or record size is not this end's (the channel is
    /// then closed; `peer`'s next call on it fails too), or for a `T` as
    /// [`Self::channel_to`] refuses; [`Error::Timeout`]; `peer`'s departure; [`Error::BrokerLost`].
    pub fn channel_from<T: Pod>(
        &mut self,
        peer: u32,
        tag: u64,
    ) -> Result<ChannelReceiver<T>, Error> {
        check_type::<T>()?;
        let made = self.ring_from(peer, size_of::<T>())?;
        if !direct::<T>() || made.offered.record_bytes as usize != size_of::<T>() {
            return Ok(ChannelReceiver {
                end: Typed::Raw(open_raw_receiver(made, tag)?),
            });
        }
        let mut ring = Consumer::<T>::join(made.fd.as_fd()).map_err(join_error)?;
        let mut first = T::zeroed();
        recv_hello(&mut ring, &made, std::slice::from_mut(&mut first))?;
        check_hello(&made, tag, bytemuck::bytes_of(&first), || {
            ring.closer().close(MISMATCH);
        })?;
        batch_releases(&mut ring, size_of::<T>());
        Ok(ChannelReceiver {
            end: Typed::Direct(ring, made.ends),
        })
    }

    /// [`Self::channel_to`] for records of `record_bytes` bytes (1 to 4096).
    ///
    /// # Errors
    ///
    /// As for [`Self::channel_to`].
    pub fn raw_channel_to(
        &mut self,
        peer: u32,
        tag: u64,
        record_bytes: usize,
        capacity: usize,
    ) -> Result<RawChannelSender, Error> {
        let made = self.ring_to(peer, record_bytes, capacity)?;
        open_raw_sender(made, tag)
    }

    /// [`Self::channel_from`] for records of `record_bytes` bytes (1 to 4096).
    ///
    /// # Errors
    ///
    /// As for [`Self::channel_from`].
    pub fn raw_channel_from(
        &mut self,
        peer: u32,
        tag: u64,
        record_bytes: usize,
    ) -> Result<RawChannelReceiver, Error> {
        let made = self.ring_from(peer, record_bytes)?;
        open_raw_receiver(made, tag)
    }

    /// Asks the broker for the ring of this rank's next channel to `peer`.
    fn ring_to(&mut self, peer: u32, record_bytes: usize, capacity: usize) -> Result<Made, Error> {
        self.check_peer(peer)?;
        let record = check_record(record_bytes)?;
        if !capacity.is_power_of_two()
            || !(2..=ChannelToken::MAX_CAPACITY as usize).contains(&capacity)
        {
            return Err(Error::Misuse(format!(
                "a channel holds 2 to {} records, a power of two; {capacity} asked for",
                ChannelToken::MAX_CAPACITY
            )));
        }
        let number = self.numbers[peer as usize].channels_to;
        // A peer not logged on yet has nothing the broker could pass the ring to: wait for it
        // (the broker tells every worker of each peer's process as it logs on).
        self.inner
            .peer_pid(peer, self.timeout)
            .map_err(|source| self.relay_failed(peer, source))?;
        let token = ChannelToken {
            record_bytes: record,
            capacity: capacity as u64,
            number,
        };
        let class = ChannelToken::class_bytes(record);
        let file_bytes = (u64::from(class) + 8).saturating_mul(capacity as u64);
        if file_bytes > ChannelToken::MAX_FILE_BYTES {
            return Err(Error::Misuse(format!(
                "a channel of {capacity} records of {record} bytes needs {file_bytes} bytes of \
                 ring, more than {}",
                ChannelToken::MAX_FILE_BYTES
            )));
        }
        // The number is spent once asked for, unless the broker refused it: it may make the
        // ring after this call gave up waiting, and offer it to `peer` as this number.
        self.numbers[peer as usize].channels_to += 1;
        let fd = match self.inner.request_channel(peer, token.pack(), self.timeout) {
            Ok(fd) => fd,
            Err(source) => {
                if matches!(source, shmbroker_handshake::Error::RelayRefused { .. }) {
                    self.numbers[peer as usize].channels_to -= 1;
                }
                return Err(self.relay_failed(peer, source));
            }
        };
        Ok(Made {
            fd,
            ends: self.ends(peer, number, record as usize),
            class,
            offered: token,
        })
    }

    /// The ring of `peer`'s next channel to this rank, as the broker offers it.
    fn ring_from(&mut self, peer: u32, record_bytes: usize) -> Result<Made, Error> {
        self.check_peer(peer)?;
        let record = check_record(record_bytes)?;
        let number = self.numbers[peer as usize].channels_from;
        let (token, fd) = self
            .inner
            .take_channel(peer, number, self.timeout)
            .map_err(|source| self.relay_failed(peer, source))?;
        self.numbers[peer as usize].channels_from += 1;
        let Some(offered) = ChannelToken::unpack(token) else {
            unreachable!("the watcher files only tokens that unpack")
        };
        Ok(Made {
            fd,
            ends: self.ends(peer, number, record as usize),
            class: ChannelToken::class_bytes(offered.record_bytes),
            offered,
        })
    }

    fn ends(&self, peer: u32, number: u64, record: usize) -> Ends {
        Ends {
            peer,
            number,
            record,
            watch: self.inner.peer_watch(),
            timeout: self.timeout,
        }
    }
}

/// Joins `made` as its producer, of its class, and sends the tag.
fn open_raw_sender(made: Made, tag: u64) -> Result<RawChannelSender, Error> {
    let mut ring = Tx::join(made.class, made.fd.as_fd()).map_err(join_error)?;
    let ends = made.ends;
    // The ring is empty: the tag goes.
    let sent = with_class!(Tx, &mut ring, |ring, Slot| try_send_slots(
        ring,
        &ends,
        &[hello::<Slot>(tag)]
    ))?;
    if sent != 1 {
        return Err(ends.closed("from", None));
    }
    Ok(RawChannelSender { ring, ends })
}

/// Joins `made` as its consumer, of the class the producer asked for, and checks the tag and
/// the record size against this end's.
fn open_raw_receiver(made: Made, tag: u64) -> Result<RawChannelReceiver, Error> {
    let mut ring = Rx::join(made.class, made.fd.as_fd()).map_err(join_error)?;
    let mut first = [0u8; 8];
    with_class!(Rx, &mut ring, |ring, Slot| {
        let mut slot = Slot::zeroed();
        recv_hello(ring, &made, std::slice::from_mut(&mut slot))?;
        first.copy_from_slice(&bytemuck::bytes_of(&slot)[..8]);
        Ok::<(), Error>(())
    })?;
    check_hello(&made, tag, &first, || {
        with_class!(Rx, &ring, |ring, Slot| ring.closer().close(MISMATCH));
    })?;
    let record_bytes = made.offered.record_bytes as usize;
    with_class!(Rx, &mut ring, |ring, Slot| batch_releases(
        ring,
        record_bytes
    ));
    Ok(RawChannelReceiver {
        ring,
        ends: made.ends,
    })
}

/// The producer's first slot, within the deadline.
fn recv_hello<S: Pod>(ring: &mut Consumer<S>, made: &Made, out: &mut [S]) -> Result<(), Error> {
    recv_slots(ring, &made.ends, out).map_err(|error| match error {
        Error::Timeout {
            waiting_for,
            timeout,
            ..
        } => Error::Timeout {
            op: "channel_from",
            waiting_for,
            timeout,
            diagnosis: Vec::new(),
            stopped: None,
        },
        other => other,
    })?;
    Ok(())
}

/// Checks the producer's record size and tag (the first 8 bytes of `first`) against this
/// end's; on a mismatch runs `refuse` (which closes the ring with [`MISMATCH`]) and says what
/// each end has.
fn check_hello(made: &Made, tag: u64, first: &[u8], refuse: impl FnOnce()) -> Result<(), Error> {
    let (peer, number, record) = (made.ends.peer, made.ends.number, made.ends.record);
    let theirs = u64::from_le_bytes(first[..8].try_into().unwrap_or([0; 8]));
    let detail = if made.offered.record_bytes as usize != record {
        format!(
            "rank {peer}'s channel #{number} to this rank carries records of {} bytes; this end \
             expects {record}",
            made.offered.record_bytes
        )
    } else if theirs != tag {
        format!(
            "rank {peer}'s channel #{number} to this rank has type tag {theirs:#x}; this end \
             expects {tag:#x}"
        )
    } else {
        return Ok(());
    };
    refuse();
    Err(Error::Misuse(detail))
}

/// A record size a channel carries, or the error.
fn check_record(record_bytes: usize) -> Result<u32, Error> {
    u32::try_from(record_bytes)
        .ok()
        .filter(|&bytes| (1..=ChannelToken::MAX_RECORD_BYTES).contains(&bytes))
        .ok_or_else(|| {
            Error::Misuse(format!(
                "a channel carries records of 1 to {} bytes; {record_bytes} asked for (send \
                 larger data as a loan a record refers to)",
                ChannelToken::MAX_RECORD_BYTES
            ))
        })
}

/// Refuses a record type a channel cannot carry in place: aligned to more than its slots.
fn check_type<T>() -> Result<(), Error> {
    if align_of::<T>() > 8 {
        return Err(Error::Misuse(format!(
            "{} is aligned to {} bytes; a channel's records are aligned to 8",
            std::any::type_name::<T>(),
            align_of::<T>()
        )));
    }
    Ok(())
}
