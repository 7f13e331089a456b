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

use super::departures::departure_error;
use super::{Error, Session};
use bytemuck::{Pod, Zeroable};
use shmbroker_bindings::ChannelToken;
use shmbroker_handshake::PeerWatch;
use shmbroker_queues::{
    Consumer, Producer, RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError,
};
use std::marker::PhantomData;
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

        /// Slots of each class copied at a time through the stack: 4 KiB of them.
        trait Batch {
            const SLOTS: usize;
        }
        $(impl Batch for $name {
            const SLOTS: usize = if $bytes >= 4096 { 1 } else { 4096 / $bytes };
        })*
    };
}

classes! {
    C8 B8 8, C16 B16 16, C32 B32 32, C64 B64 64, C128 B128 128, C256 B256 256,
    C512 B512 512, C1024 B1024 1024, C2048 B2048 2048, C4096 B4096 4096,
}

/// What both ends of a channel know about it.
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
    /// channel closing, whether or not the other end's session has gone since.
    fn closed(&self, direction: &'static str) -> Error {
        Error::ChannelClosed {
            peer: self.peer,
            number: self.number,
            direction,
        }
    }

    /// After a slice of waiting: the error that ends the wait, if any.
    fn look(&self, op: &'static str, started: Instant, interrupts: u64) -> Option<Error> {
        if let Some(departure) = self.watch.departure(self.peer) {
            return Some(departure_error(departure));
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

/// Copies `record` into the front of a zeroed slot of class `S`.
fn slot_of<S: Pod>(record: &[u8]) -> S {
    let mut slot = S::zeroed();
    bytemuck::bytes_of_mut(&mut slot)[..record.len()].copy_from_slice(record);
    slot
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
    /// [`Error::ChannelClosed`] once the consumer closed the channel, its departure once its
    /// process is gone, [`Error::Misuse`] for a length that is not a whole number of records.
    pub fn try_send_batch(&mut self, records: &[u8]) -> Result<usize, Error> {
        let count = self.ends.check_len(records.len(), "a batch")?;
        let record = self.ends.record;
        let mut sent = 0;
        while sent < count {
            let rest = &records[sent * record..];
            let went = with_class!(Tx, &mut self.ring, |ring, Slot| {
                // Records that fill their slots, aligned as slots are: sent from where they are.
                if let Some(slots) = (record == size_of::<Slot>())
                    .then(|| bytemuck::try_cast_slice::<u8, Slot>(rest).ok())
                    .flatten()
                {
                    ring.try_send_batch(slots).map(|n| (n, count - sent))
                } else {
                    let take = (count - sent).min(<Slot as Batch>::SLOTS);
                    let mut slots = [Slot::zeroed(); <Slot as Batch>::SLOTS];
                    for (slot, bytes) in slots.iter_mut().zip(rest.chunks_exact(record)) {
                        *slot = slot_of(bytes);
                    }
                    ring.try_send_batch(&slots[..take]).map(|n| (n, take))
                }
            });
            let went = went.map(|(n, take)| (n, n == take));
            match went {
                Ok((n, all)) => {
                    sent += n;
                    if !all {
                        break;
                    }
                }
                Err(TrySendError::Full(())) => break,
                Err(TrySendError::Disconnected(())) => return Err(self.closed()),
                Err(TrySendError::Corrupted((), corruption)) => {
                    return Err(Error::Corrupted {
                        peer: self.ends.peer,
                        corruption,
                    });
                }
            }
        }
        Ok(sent)
    }

    /// Sends one record if the ring has room now: `false` if not.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_send_batch`].
    pub fn try_send(&mut self, record: &[u8]) -> Result<bool, Error> {
        self.ends.check_record(record.len())?;
        let went = with_class!(Tx, &mut self.ring, |ring, Slot| ring
            .try_send(slot_of::<Slot>(record))
            .map_err(|e| match e {
                TrySendError::Full(_) => TrySendError::Full(()),
                TrySendError::Disconnected(_) => TrySendError::Disconnected(()),
                TrySendError::Corrupted(_, c) => TrySendError::Corrupted((), c),
            }));
        match went {
            Ok(()) => Ok(true),
            Err(TrySendError::Full(())) => Ok(false),
            Err(TrySendError::Disconnected(())) => Err(self.closed()),
            Err(TrySendError::Corrupted((), corruption)) => Err(Error::Corrupted {
                peer: self.ends.peer,
                corruption,
            }),
        }
    }

    /// Sends one record, waiting for room within the channel's deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_send_batch`], and [`Error::Timeout`], [`Error::Interrupted`].
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
        let count = self.ends.check_len(records.len(), "a batch")?;
        let record = self.ends.record;
        let mut sent = self.try_send_batch(records)?;
        if sent == count {
            return Ok(());
        }
        let started = Instant::now();
        let interrupts = self.ends.watch.interrupt_count();
        while sent < count {
            let bytes = &records[sent * record..(sent + 1) * record];
            let slice = LOOK_EVERY.min(self.ends.timeout.saturating_sub(started.elapsed()));
            let went = with_class!(Tx, &mut self.ring, |ring, Slot| ring
                .send_timeout(slot_of::<Slot>(bytes), slice)
                .map_err(|e| match e {
                    SendTimeoutError::Timeout(_) => None,
                    SendTimeoutError::Disconnected(_) => Some(TrySendError::Disconnected(())),
                    SendTimeoutError::Corrupted(_, c) => Some(TrySendError::Corrupted((), c)),
                }));
            match went {
                Ok(()) => sent += 1 + self.try_send_batch(&records[(sent + 1) * record..])?,
                Err(None) => {
                    if let Some(error) = self.ends.look("channel send", started, interrupts) {
                        return Err(error);
                    }
                }
                Err(Some(TrySendError::Corrupted((), corruption))) => {
                    return Err(Error::Corrupted {
                        peer: self.ends.peer,
                        corruption,
                    });
                }
                Err(Some(_)) => return Err(self.closed()),
            }
        }
        Ok(())
    }

    /// The error for a ring the consumer closed.
    fn closed(&self) -> Error {
        let cause = with_class!(Tx, &self.ring, |ring, Slot| ring.close_cause());
        if cause == Some(MISMATCH) {
            return Error::Misuse(format!(
                "rank {} refused channel #{} from this rank: its type tag or record size is not \
                 this end's ({} bytes; its error says what it expected)",
                self.ends.peer, self.ends.number, self.ends.record
            ));
        }
        self.ends.closed("from")
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
    /// received; its departure once its process is gone and everything it sent was received;
    /// [`Error::Misuse`] for a length that is not a whole number of records.
    pub fn try_recv_batch(&mut self, records: &mut [u8]) -> Result<usize, Error> {
        let count = self.ends.check_len(records.len(), "a buffer")?;
        let record = self.ends.record;
        let mut taken = 0;
        while taken < count {
            let rest = &mut records[taken * record..];
            let left = count - taken;
            let got = with_class!(Rx, &mut self.ring, |ring, Slot| {
                // Records that fill their slots, aligned as slots are: received in place.
                if let Some(slots) = (record == size_of::<Slot>())
                    .then(|| bytemuck::try_cast_slice_mut::<u8, Slot>(rest).ok())
                    .flatten()
                {
                    ring.try_recv_batch(slots).map(|n| (n, n == left))
                } else {
                    let want = left.min(<Slot as Batch>::SLOTS);
                    let mut slots = [Slot::zeroed(); <Slot as Batch>::SLOTS];
                    let got = ring.try_recv_batch(&mut slots[..want]);
                    if let Ok(n) = got {
                        for (bytes, slot) in rest.chunks_exact_mut(record).zip(&slots[..n]) {
                            bytes.copy_from_slice(&bytemuck::bytes_of(slot)[..record]);
                        }
                    }
                    got.map(|n| (n, n == want))
                }
            });
            match got {
                Ok((n, all)) => {
                    taken += n;
                    if !all {
                        break;
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if taken > 0 => break,
                Err(TryRecvError::Disconnected) => return Err(self.ends.closed("to")),
                Err(TryRecvError::Corrupted(corruption)) => {
                    return Err(Error::Corrupted {
                        peer: self.ends.peer,
                        corruption,
                    });
                }
            }
        }
        Ok(taken)
    }

    /// Receives one record into `record` if one has arrived: `false` if none.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_recv_batch`].
    pub fn try_recv(&mut self, record: &mut [u8]) -> Result<bool, Error> {
        self.ends.check_record(record.len())?;
        let len = record.len();
        let got = with_class!(Rx, &mut self.ring, |ring, Slot| ring.try_recv().map(
            |slot| {
                record.copy_from_slice(&bytemuck::bytes_of::<Slot>(&slot)[..len]);
            }
        ));
        match got {
            Ok(()) => Ok(true),
            Err(TryRecvError::Empty) => Ok(false),
            Err(TryRecvError::Disconnected) => Err(self.ends.closed("to")),
            Err(TryRecvError::Corrupted(corruption)) => Err(Error::Corrupted {
                peer: self.ends.peer,
                corruption,
            }),
        }
    }

    /// Receives one record, waiting for it within the channel's deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_recv_batch`], and [`Error::Timeout`], [`Error::Interrupted`].
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
        let taken = self.try_recv_batch(records)?;
        if taken > 0 || records.is_empty() {
            return Ok(taken);
        }
        let record = self.ends.record;
        let started = Instant::now();
        let interrupts = self.ends.watch.interrupt_count();
        loop {
            let slice = LOOK_EVERY.min(self.ends.timeout.saturating_sub(started.elapsed()));
            let got = with_class!(Rx, &mut self.ring, |ring, Slot| ring
                .recv_timeout(slice)
                .map(|slot| {
                    records[..record].copy_from_slice(&bytemuck::bytes_of::<Slot>(&slot)[..record]);
                }));
            match got {
                Ok(()) => return Ok(1 + self.try_recv_batch(&mut records[record..])?),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Interrupted) => {
                    if let Some(error) = self.ends.look("channel recv", started, interrupts) {
                        return Err(error);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return Err(self.ends.closed("to")),
                Err(RecvTimeoutError::Corrupted(corruption)) => {
                    return Err(Error::Corrupted {
                        peer: self.ends.peer,
                        corruption,
                    });
                }
            }
        }
    }
}

/// The sending end of a channel of `T` records ([`Session::channel_to`]).
#[derive(Debug)]
pub struct ChannelSender<T> {
    raw: RawChannelSender,
    _records: PhantomData<fn(T)>,
}

/// The receiving end of a channel of `T` records ([`Session::channel_from`]).
#[derive(Debug)]
pub struct ChannelReceiver<T> {
    raw: RawChannelReceiver,
    _records: PhantomData<fn() -> T>,
}

impl<T: Pod> ChannelSender<T> {
    /// The rank at the other end.
    #[must_use]
    pub fn peer(&self) -> u32 {
        self.raw.peer()
    }

    /// Sends `record` if the ring has room now: `false` if not.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelSender::try_send_batch`].
    pub fn try_send(&mut self, record: &T) -> Result<bool, Error> {
        self.raw.try_send(bytemuck::bytes_of(record))
    }

    /// Sends `record`, waiting for room within the deadline.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelSender::send`].
    pub fn send(&mut self, record: &T) -> Result<(), Error> {
        self.raw.send(bytemuck::bytes_of(record))
    }

    /// Sends as many of `records` as the ring has room for now; returns how many.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelSender::try_send_batch`].
    pub fn try_send_batch(&mut self, records: &[T]) -> Result<usize, Error> {
        self.raw.try_send_batch(bytemuck::cast_slice(records))
    }

    /// Sends every record of `records`, waiting for room as it needs.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelSender::send_batch`].
    pub fn send_batch(&mut self, records: &[T]) -> Result<(), Error> {
        self.raw.send_batch(bytemuck::cast_slice(records))
    }
}

impl<T: Pod> ChannelReceiver<T> {
    /// The rank at the other end.
    #[must_use]
    pub fn peer(&self) -> u32 {
        self.raw.peer()
    }

    /// The next record if one has arrived.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelReceiver::try_recv_batch`].
    pub fn try_recv(&mut self) -> Result<Option<T>, Error> {
        let mut record = T::zeroed();
        Ok(self
            .raw
            .try_recv(bytemuck::bytes_of_mut(&mut record))?
            .then_some(record))
    }

    /// The next record, waiting for it within the deadline.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelReceiver::recv`].
    pub fn recv(&mut self) -> Result<T, Error> {
        let mut record = T::zeroed();
        self.raw.recv(bytemuck::bytes_of_mut(&mut record))?;
        Ok(record)
    }

    /// Records that have arrived, into `records`, up to its length; how many.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelReceiver::try_recv_batch`].
    pub fn try_recv_batch(&mut self, records: &mut [T]) -> Result<usize, Error> {
        self.raw.try_recv_batch(bytemuck::cast_slice_mut(records))
    }

    /// Records that have arrived, into `records`, waiting for the first; how many.
    ///
    /// # Errors
    ///
    /// As for [`RawChannelReceiver::recv_batch`].
    pub fn recv_batch(&mut self, records: &mut [T]) -> Result<usize, Error> {
        self.raw.recv_batch(bytemuck::cast_slice_mut(records))
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
        Ok(ChannelSender {
            raw: self.raw_channel_to(peer, tag, size_of::<T>(), capacity)?,
            _records: PhantomData,
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
        Ok(ChannelReceiver {
            raw: self.raw_channel_from(peer, tag, size_of::<T>())?,
            _records: PhantomData,
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
        let number = self.peers[peer as usize].channels_to;
        // A peer not logged on yet has nothing the broker could pass the ring to: wait for it
        // (the broker tells every worker of each peer's process as it logs on).
        self.inner
            .peer_pid(peer, self.timeout)
            .map_err(|source| Error::Relay { peer, source })?;
        let token = ChannelToken {
            record_bytes: record,
            capacity: capacity as u64,
            number,
        };
        let fd = self
            .inner
            .request_channel(peer, token.pack(), self.timeout)
            .map_err(|source| Error::Relay { peer, source })?;
        self.peers[peer as usize].channels_to += 1;
        let class = ChannelToken::class_bytes(record);
        let ring = Tx::join(class, fd.as_fd()).map_err(|source| Error::Io {
            what: "joining a channel's ring the broker made",
            source: std::io::Error::other(source),
        })?;
        let mut sender = RawChannelSender {
            ring,
            ends: Ends {
                peer,
                number,
                record: record as usize,
                watch: self.inner.peer_watch(),
                timeout: self.timeout,
            },
        };
        // The first record is the tag, for the consumer to check: a slot of the class, the tag
        // in its first 8 bytes. The ring is empty, so it goes.
        let hello = with_class!(Tx, &mut sender.ring, |ring, Slot| {
            let mut slot = Slot::zeroed();
            bytemuck::bytes_of_mut(&mut slot)[..8].copy_from_slice(&tag.to_le_bytes());
            ring.try_send(slot).is_ok()
        });
        if !hello {
            return Err(sender.closed());
        }
        Ok(sender)
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
        self.check_peer(peer)?;
        let record = check_record(record_bytes)?;
        let number = self.peers[peer as usize].channels_from;
        let (token, fd) = self
            .inner
            .take_channel(peer, number, self.timeout)
            .map_err(|source| Error::Relay { peer, source })?;
        self.peers[peer as usize].channels_from += 1;
        let Some(offered) = ChannelToken::unpack(token) else {
            unreachable!("the watcher files only tokens that unpack")
        };
        let class = ChannelToken::class_bytes(offered.record_bytes);
        let ring = Rx::join(class, fd.as_fd()).map_err(|source| Error::Io {
            what: "joining a channel's ring the broker made",
            source: std::io::Error::other(source),
        })?;
        let mut receiver = RawChannelReceiver {
            ring,
            ends: Ends {
                peer,
                number,
                record: offered.record_bytes as usize,
                watch: self.inner.peer_watch(),
                timeout: self.timeout,
            },
        };
        let mut first = [0u8; 8];
        let read_tag = with_class!(Rx, &mut receiver.ring, |ring, Slot| ring
            .recv_timeout(self.timeout)
            .map(|slot| first.copy_from_slice(&bytemuck::bytes_of::<Slot>(&slot)[..8])));
        let refuse = |receiver: &RawChannelReceiver, detail: String| {
            with_class!(Rx, &receiver.ring, |ring, Slot| ring
                .closer()
                .close(MISMATCH));
            Err(Error::Misuse(detail))
        };
        match read_tag {
            Ok(()) => {}
            Err(RecvTimeoutError::Interrupted) => return Err(Error::Interrupted),
            Err(RecvTimeoutError::Timeout) => {
                return Err(Error::Timeout {
                    op: "channel_from",
                    waiting_for: vec![peer],
                    timeout: self.timeout,
                    diagnosis: Vec::new(),
                    stopped: None,
                });
            }
            Err(RecvTimeoutError::Disconnected) => return Err(receiver.ends.closed("to")),
            Err(RecvTimeoutError::Corrupted(corruption)) => {
                return Err(Error::Corrupted { peer, corruption });
            }
        }
        let theirs = u64::from_le_bytes(first);
        if offered.record_bytes != record {
            return refuse(
                &receiver,
                format!(
                    "rank {peer}'s channel #{number} to this rank carries records of {} bytes; \
                     this end expects {record}",
                    offered.record_bytes
                ),
            );
        }
        if theirs != tag {
            return refuse(
                &receiver,
                format!(
                    "rank {peer}'s channel #{number} to this rank has type tag {theirs:#x}; this \
                     end expects {tag:#x}"
                ),
            );
        }
        Ok(receiver)
    }
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
