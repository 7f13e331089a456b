//! The demultiplexer: one peer's ring slots in, whole messages out, with no I/O.
//!
//! Everything a peer writes into its ring toward this rank is another process's bytes. This
//! module is the only code that gives them meaning, and it does nothing else: no ring, no clock,
//! no outbox mapping. The session's receive path reads slots from the ring and hands them to an
//! [`Inbox`]; a receive ([`Incoming`]) then takes whole messages out of it, or, when nothing is
//! queued, takes the eager message it expects straight from what the ring gave
//! ([`Incoming::take_slot`], [`Incoming::eager_direct`]) after the same checks. Bytes that live in the
//! sender's outbox (pipelined chunks, loans) are read through [`Payloads`], which the session
//! implements over the peer's mapped outbox and the fuzz target `demux` over a plain buffer.
//!
//! # Frames
//!
//! A peer's slots form *groups*, in order:
//!
//! - **eager**: a header (operation, tag, `len` up to [`kind::EAGER_MAX`], the first
//!   [`INLINE_BYTES`] in `inline`) and then [`kind::continuation_slots`]`(len)` raw slots;
//! - **pipelined**: a header (`PIPELINED` flag, the total length in `inline[..8]`, nothing else)
//!   and then `CHUNK` slots with the same tag, each referring to 1 byte or more of the sender's
//!   outbox, until they add up to the total;
//! - **loan**: one slot (`LOAN` flag) referring to the lent bytes;
//! - **acknowledgement**: one `PAYLOAD_ACK` slot giving back a block of this rank's outbox. It is
//!   not queued: [`Inbox::push`] hands it to the caller at once.
//!
//! Collectives take the first group that is not a point-to-point `SEND`; a point-to-point
//! receive takes the first `SEND`. Either checks the group's operation and sequence number
//! ([`Expect::check`]) before using a byte of it.
//!
//! # Invariants (checked by the unit tests below and the `demux` fuzz target)
//!
//! - Nothing a peer writes makes this module panic or allocate more than the peer announced and
//!   this process agreed to ([`Sink::prepare`]).
//! - Every refusal is an error naming the peer ([`Error::rank`] is the peer).
//! - A message is delivered at most once, whole, and point-to-point messages in tag order:
//!   a group leaves the queue only when it has been received (or refused, which ends the link).
//! - A message too long for a caller's buffer is left queued, whole, when the receive says so
//!   ([`Incoming::keeping_too_long`]).
//! - A point-to-point pipelined message whose receive ends between its chunks (an interrupt, a
//!   deadline) is set aside ([`Inbox::set_aside`]): its bytes so far are kept, a *resumption*
//!   header takes the place of its own, and the next receive that selects it starts where this
//!   one stopped. So it is neither lost nor delivered twice. A resumption header is made only
//!   here: its flag is one [`transport`] refuses, so no peer can forge one.
//! - A collective's receive that ends between chunks is abandoned ([`Inbox::abandon`]): nothing
//!   can receive the rest of its message, which goes, queued or to come, so that no chunk is
//!   left where the next message's header belongs. Closing a stream ends a receive in the same
//!   way, wherever its message is queued ([`Inbox::close_stream`]).

use crate::error::Error;
use frame::RESUMED;
pub use frame::{Expect, Sink, stream_of};
pub(crate) use frame::{
    LoanNote, loan_note, message, message_len, read_ref, transport, with_loan_ref, with_ref,
};
use shmbroker_bindings::{INLINE_BYTES, Message, PayloadRef, kind};
use std::collections::VecDeque;

mod frame;

/// The most messages queued from one peer that no call has taken yet; past it the peer is
/// refused with [`Error::Protocol`] rather than this process's memory growing without bound.
pub const MAX_UNREAD: usize = 1 << 20;

/// What a set-aside receive had received of a pipelined message.
#[derive(Debug)]
struct Partial {
    tag: u64,
    total: u64,
    /// The bytes so far; `None` when they did not fit the receive's buffer.
    bytes: Option<Vec<u8>>,
}

/// Reads the bytes a reference names in the sending peer's outbox, and gives the block back.
pub trait Payloads {
    /// Copies the bytes `payload` refers to into `out` (`out.len() == payload.len`), after
    /// checking the reference against the outbox.
    ///
    /// # Errors
    ///
    /// A reference outside the outbox, naming the peer.
    fn read_into(&mut self, payload: PayloadRef, out: &mut [u8]) -> Result<(), Error>;

    /// Acknowledges `payload` to its owner: the block may be reused.
    ///
    /// # Errors
    ///
    /// As sending the acknowledgement may fail.
    fn ack(&mut self, payload: PayloadRef) -> Result<(), Error>;
}

/// One message being received from `peer`, step by step.
#[derive(Debug)]
pub struct Incoming<'a> {
    pub(super) peer: u32,
    pub(super) expect: Expect,
    pub(super) sink: Sink<'a>,
    state: InState,
    /// A message too long for a [`Sink::Slice`] is left queued, whole, and the receive fails
    /// with [`Error::BufferTooSmall`] at once (a point-to-point receive: the caller may retry with
    /// a larger buffer). Otherwise it is received to its end and dropped (a collective, whose
    /// sequence must move on).
    keep_too_long: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InState {
    /// Waiting for the header.
    Header,
    /// Taking chunks: the group continues at `queue[at]`.
    Chunks {
        at: usize,
        tag: u64,
        total: u64,
        done: u64,
        fits: bool,
    },
    /// Complete: `len` bytes arrived (and fit, unless `fits` is false).
    Done { len: u64, fits: bool },
}

impl<'a> Incoming<'a> {
    /// A receive from `peer` of the group `expect` selects, into `sink`.
    #[must_use]
    pub fn new(peer: u32, expect: Expect, sink: Sink<'a>) -> Self {
        Self {
            peer,
            expect,
            sink,
            state: InState::Header,
            keep_too_long: false,
        }
    }

    /// A point-to-point receive: a message too long for the caller's buffer stays queued.
    #[must_use]
    pub fn keeping_too_long(peer: u32, expect: Expect, sink: Sink<'a>) -> Self {
        Self {
            keep_too_long: true,
            ..Self::new(peer, expect, sink)
        }
    }

    /// [`Error::BufferTooSmall`] when the message `header` opens does not fit and is to be
    /// kept. Its length is read only then: collectives and vector sinks pay nothing.
    fn refuse_too_long(&self, header: &Message) -> Result<(), Error> {
        let Sink::Slice(buffer) = &self.sink else {
            return Ok(());
        };
        if !self.keep_too_long {
            return Ok(());
        }
        let len = message_len(self.peer, header)?;
        if len > buffer.len() as u64 {
            return Err(Error::BufferTooSmall {
                peer: self.peer,
                needed: len,
                capacity: buffer.len(),
            });
        }
        Ok(())
    }

    /// Whether the whole message has arrived.
    #[must_use]
    pub fn is_done(&self) -> bool {
        matches!(self.state, InState::Done { .. })
    }

    /// Whether nothing of the message has arrived yet.
    pub(super) fn at_header(&self) -> bool {
        self.state == InState::Header
    }

    /// Whether the header of a pipelined message arrived and chunks are still due.
    #[must_use]
    pub fn mid_transfer(&self) -> bool {
        matches!(self.state, InState::Chunks { .. })
    }

    /// A number that grows with each byte received (and with nothing else).
    pub(super) fn progress(&self) -> u64 {
        match self.state {
            InState::Header => 0,
            InState::Chunks { done, .. } => 1 + done,
            InState::Done { len, .. } => 2 + len,
        }
    }

    /// The continuation slots of the eager message `header` (taken straight from the ring while
    /// nothing from its peer is queued) when this receive can take them straight from the ring
    /// too: the message is the one expected, of a known operation, longer than a slot, and
    /// fits. `None` otherwise, errors included: the caller files the header and the inbox takes
    /// the message (and says what is wrong with it), as it would have.
    pub(super) fn eager_direct(&mut self, header: &Message) -> Option<usize> {
        let len = header.len as usize;
        if !self.at_header()
            || len <= INLINE_BYTES
            || len > kind::EAGER_MAX
            || !plain_eager(header)
            || !self.expect.selects(header)
        {
            return None;
        }
        if self.expect.check(self.peer, header).is_err() || self.refuse_too_long(header).is_err() {
            return None;
        }
        match self.sink.prepare(self.peer, len as u64) {
            Ok(true) => Some(kind::continuation_slots(len)),
            Ok(false) | Err(_) => None,
        }
    }

    /// Receives the eager message `header` from its `continuation` slots, straight from the
    /// ring, after [`Self::eager_direct`] said yes and how many. Whether it did: `false`, taking
    /// nothing, for any other header or number of slots.
    pub(super) fn finish_eager(&mut self, header: &Message, continuation: &[Message]) -> bool {
        let len = header.len as usize;
        let fits = matches!(self.sink.prepare(self.peer, len as u64), Ok(true));
        if !self.at_header()
            || !fits
            || len > kind::EAGER_MAX
            || continuation.len() != kind::continuation_slots(len)
        {
            return false;
        }
        copy_eager(self.sink.window(0, len), header, continuation);
        self.state = InState::Done {
            len: len as u64,
            fits: true,
        };
        true
    }

    /// Receives a message taken straight from the ring while nothing from its peer is queued,
    /// if it is the one-slot message this receive expects (then `Ok(true)`). `Ok(false)` when it
    /// is another message, which the caller files in the peer's [`Inbox`]. A message too long
    /// for a kept buffer is [`Error::BufferTooSmall`]: the caller files it, whole, and fails.
    ///
    /// # Errors
    ///
    /// As [`Expect::check`]; [`Error::BufferTooSmall`].
    pub(super) fn take_slot(&mut self, slot: &Message) -> Result<bool, Error> {
        let one_slot = plain_eager(slot) && slot.len as usize <= INLINE_BYTES;
        if !self.at_header() || !one_slot || !self.expect.selects(slot) {
            return Ok(false);
        }
        self.expect.check(self.peer, slot)?;
        self.refuse_too_long(slot)?;
        let len = slot.len as usize;
        let fits = self.sink.prepare(self.peer, len as u64)?;
        if fits {
            self.sink
                .window(0, len)
                .copy_from_slice(&slot.inline[..len]);
        }
        self.state = InState::Done {
            len: len as u64,
            fits,
        };
        Ok(true)
    }

    /// The length received, or [`Error::BufferTooSmall`] when it did not fit the caller's buffer.
    ///
    /// # Errors
    ///
    /// [`Error::BufferTooSmall`]; [`Error::Misuse`] before the message is whole.
    pub fn finish(self) -> Result<(u64, Sink<'a>), Error> {
        match self.state {
            InState::Done { len, fits: true } => Ok((len, self.sink)),
            InState::Done { len, fits: false } => Err(Error::BufferTooSmall {
                peer: self.peer,
                needed: len,
                capacity: match self.sink {
                    Sink::Slice(buffer) => buffer.len(),
                    Sink::Vec(bytes) => bytes.len(),
                },
            }),
            _ => Err(Error::Misuse(
                "a receive was finished before it completed".into(),
            )),
        }
    }
}

/// A pipelined message a receive is taking: its tag, and the index in the queue of its next
/// chunk. The index stays right while the receive goes on: chunks are taken from there, and
/// nothing before it is removed meanwhile (one receive at a time per peer). Closing a stream
/// rebuilds the queue: it ends a collective's receive, and moves a point-to-point one's index
/// to where its message went (see [`Inbox::taking_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Taking {
    tag: u64,
    at: usize,
    /// A point-to-point message's (not a collective's): closing a stream leaves it be.
    point_to_point: bool,
}

/// What one peer sent that no receive has taken yet: its slots in arrival order, grouped into
/// messages by [`Inbox::find`].
#[derive(Debug)]
pub struct Inbox {
    peer: u32,
    queue: VecDeque<Message>,
    /// Continuation slots still owed by the eager message last queued.
    owed: usize,
    /// The message a receive set aside between its chunks, if any.
    partial: Option<Box<Partial>>,
    /// Streams whose collectives are over (a member departed): their pipelined and lent
    /// messages are dropped as they come (see [`Self::close_stream`]).
    closed: Vec<u32>,
    /// The pipelined message a receive is taking the chunks of, if any: its tag, and where its
    /// next chunk is queued (`queue[at]`, behind the groups the receive passed over). If the
    /// receive ends before the message does, the rest of its chunks go (see
    /// [`Self::abandon`], [`Self::close_stream`]).
    taking: Option<Taking>,
    /// The tag of a dropped pipelined message whose chunks are still to come: they are dropped
    /// as they come, up to the next header (its sender gave up on it then).
    orphans: Option<u64>,
    /// Blocks of the peer's outbox that dropped messages referred to, to acknowledge (see
    /// [`Self::take_dropped`]).
    dropped: Vec<PayloadRef>,
}

impl Inbox {
    /// The inbox of what `peer` sends.
    #[must_use]
    pub fn new(peer: u32) -> Self {
        Self {
            peer,
            queue: VecDeque::new(),
            owed: 0,
            partial: None,
            closed: Vec::new(),
            taking: None,
            orphans: None,
            dropped: Vec::new(),
        }
    }

    /// Whether nothing is queued and no continuation slot is owed: the next slot in the ring is
    /// a header.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.owed == 0 && self.orphans.is_none()
    }

    /// Whether any slot is queued (a group may be found).
    #[must_use]
    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// How many slots to read from the ring next: one header (which must be looked at before what
    /// follows it can be told apart), or the continuation slots owed, at most `most`.
    #[must_use]
    pub fn wants(&self, most: usize) -> usize {
        if self.owed == 0 {
            1
        } else {
            self.owed.min(most)
        }
    }

    /// [`Error::Protocol`] once [`MAX_UNREAD`] messages are queued: the peer floods.
    ///
    /// # Errors
    ///
    /// As said.
    pub fn check_room(&self) -> Result<(), Error> {
        if self.queue.len() >= MAX_UNREAD {
            return Err(Error::Protocol {
                peer: self.peer,
                detail: format!(
                    "sent more than {MAX_UNREAD} messages that nobody receives yet; expected them \
                     to be received first"
                ),
            });
        }
        Ok(())
    }

    /// Files the next slot read from the peer's ring. An acknowledgement is checked and returned
    /// (it gives back a block of this rank's outbox, which is the caller's business); anything
    /// else is queued. An eager header makes the next slots its continuation.
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] for a slot that cannot start a group: an unknown kind, a malformed
    /// reference, an eager message longer than [`kind::EAGER_MAX`].
    pub fn push(&mut self, slot: Message) -> Result<Option<PayloadRef>, Error> {
        let peer = self.peer;
        if self.owed > 0 {
            self.queue.push_back(slot);
            self.owed -= 1;
            return Ok(None);
        }
        if slot.kind == kind::PAYLOAD_ACK {
            return read_ref(peer, &slot).map(Some);
        }
        if slot.kind == kind::CHUNK {
            let piece = read_ref(peer, &slot)?;
            if self.orphans == Some(slot.tag) {
                self.dropped.push(piece);
            } else {
                self.queue.push_back(slot);
            }
            return Ok(None);
        }
        self.orphans = None;
        let eager = transport(peer, &slot)? == 0;
        let len = slot.len as usize;
        if eager && len > kind::EAGER_MAX {
            return Err(Error::Protocol {
                peer,
                detail: format!(
                    "eager message of {len} bytes; at most {} travel eagerly",
                    kind::EAGER_MAX
                ),
            });
        }
        if !eager && self.of_closed_stream(&slot) {
            if slot.kind & kind::PIPELINED != 0 {
                self.orphans = Some(slot.tag);
            } else {
                self.dropped.push(read_ref(peer, &slot)?);
            }
            return Ok(None);
        }
        self.queue.push_back(slot);
        if eager {
            self.owed = kind::continuation_slots(len);
        }
        Ok(None)
    }

    /// Whether `header` is a collective message of a stream [`Self::close_stream`] closed.
    fn of_closed_stream(&self, header: &Message) -> bool {
        !self.closed.is_empty()
            && header.kind & kind::OP_MASK != kind::SEND
            && self.closed.contains(&stream_of(header.tag))
    }

    /// Closes `stream`: its collectives are over (a member departed), so none of its messages
    /// will ever be received. What is queued of them goes, and so will what comes: pipelined and
    /// lent messages as they arrive (the chunks of a pipelined one up to the next header), so
    /// that a message cut off between its chunks when its sender gave up does not stand in the
    /// way of the messages of other streams (a group's after [`crate::Session::shrink`]). Chunks
    /// queued where a header belongs go too: the rest of a message whose receive ended. Eager
    /// messages of the stream go if queued whole; one that comes later stays queued, never taken
    /// (it holds no block, and skipping its continuation slots is not worth a state). The blocks
    /// dropped messages referred to are handed out by [`Self::take_dropped`], to be
    /// acknowledged: the peer then frees them.
    ///
    /// A stream is closed only where no collective's receive is under way, or as a failed
    /// call's receives end: a collective's receive still taking a message then has ended, and
    /// the rest of that message goes, queued or to come, as [`Self::abandon`] would drop it. A
    /// point-to-point receive under way goes on: its message stays, and it finds where.
    pub fn close_stream(&mut self, stream: u32) {
        if !self.closed.contains(&stream) {
            self.closed.push(stream);
        }
        let peer = self.peer;
        // A point-to-point message a receive is taking belongs to no stream: it stays taken, and
        // the receive goes on with it where it moves to (a split session's sending half may
        // close a stream while its receiving half is between the chunks of one).
        let kept = self.taking.filter(|taking| taking.point_to_point);
        // Otherwise, first the message a receive was taking, found where it is: the groups queued
        // ahead of it (that receive passed over them) say nothing about whether its sender gave
        // up on it.
        let taken = if kept.is_some() {
            None
        } else {
            self.drop_taken()
        };
        let old = std::mem::take(&mut self.queue);
        let mut kept_at = None;
        let drop_ref = |slot: &Message, dropped: &mut Vec<PayloadRef>| {
            if let Ok(piece) = read_ref(peer, slot) {
                dropped.push(piece);
            }
        };
        let mut at = 0;
        // The tag of a dropped message whose last chunks may be still to come.
        let mut cut = None;
        while let Some(&slot) = old.get(at) {
            if let Some(kept) = kept
                && at == kept.at
                && kept_at.is_none()
            {
                // The kept message's chunks queued so far, where its header was.
                kept_at = Some(self.queue.len());
                while let Some(&chunk) = old.get(at)
                    && chunk.kind == kind::CHUNK
                    && chunk.tag == kept.tag
                {
                    self.queue.push_back(chunk);
                    at += 1;
                }
                cut = None;
                continue;
            }
            if slot.kind == kind::CHUNK {
                // Where a header belongs: the rest of a message whose receive ended (or junk).
                drop_ref(&slot, &mut self.dropped);
                at += 1;
                continue;
            }
            cut = None;
            let closed = self.of_closed_stream(&slot) && slot.kind & RESUMED == 0;
            let flags = slot.kind & !kind::OP_MASK;
            if flags == 0 {
                let extent = 1 + kind::continuation_slots(slot.len as usize);
                let end = (at + extent).min(old.len());
                if !(closed && at + extent <= old.len()) {
                    self.queue.extend(old.range(at..end));
                }
                at = end;
            } else if flags & kind::PIPELINED != 0 {
                let mut end = at + 1;
                while old
                    .get(end)
                    .is_some_and(|chunk| chunk.kind == kind::CHUNK && chunk.tag == slot.tag)
                {
                    end += 1;
                }
                if closed {
                    for chunk in old.range(at + 1..end) {
                        drop_ref(chunk, &mut self.dropped);
                    }
                    cut = Some(slot.tag);
                } else {
                    self.queue.extend(old.range(at..end));
                }
                at = end;
            } else {
                if closed {
                    drop_ref(&slot, &mut self.dropped);
                } else {
                    self.queue.push_back(slot);
                }
                at += 1;
            }
        }
        if let Some(kept) = kept {
            // No chunk of it was queued: its next one will come after all that is.
            let at = kept_at.unwrap_or(self.queue.len());
            self.taking = Some(Taking { at, ..kept });
            // Its sender is still sending it: every other message's chunks came before it.
            cut = None;
        }
        // Chunks still to come belong to the taken message if nothing was queued after it, else
        // to the last message queued, if that one was dropped (a message whose continuation
        // slots are owed is eager, and kept).
        if taken.is_some() {
            self.orphans = taken;
        } else if self.owed == 0 && cut.is_some() {
            self.orphans = cut;
        }
    }

    /// Ends the receive taking a pipelined message, if one is: its chunks queued go (their
    /// blocks to acknowledge), and its tag is returned when the rest of them may still come
    /// (nothing is queued after them), for [`Self::orphans`] to drop as they arrive.
    fn drop_taken(&mut self) -> Option<u64> {
        let Taking { tag, at, .. } = self.taking.take()?;
        let mut end = at;
        while let Some(chunk) = self.queue.get(end)
            && chunk.kind == kind::CHUNK
            && chunk.tag == tag
            && let Ok(piece) = read_ref(self.peer, chunk)
        {
            self.dropped.push(piece);
            end += 1;
        }
        self.queue.drain(at.min(end)..end);
        // Anything after it (a header, or whatever the next receive will name) means its sender
        // gave up on it.
        (at >= self.queue.len() && self.owed == 0).then_some(tag)
    }

    /// Where the message a receive takes as `tag` continues: `at`, as the receive last saw it,
    /// unless [`Self::close_stream`] has moved it since (a point-to-point message stays taken
    /// while a stream closes around it).
    fn taking_at(&self, tag: u64, at: usize) -> usize {
        match self.taking {
            Some(taking) if taking.tag == tag => taking.at,
            _ => at,
        }
    }

    /// Whether [`Self::take_dropped`] has blocks to hand out.
    #[must_use]
    pub fn has_dropped(&self) -> bool {
        !self.dropped.is_empty()
    }

    /// The blocks of the peer's outbox that dropped messages referred to, each to be
    /// acknowledged once.
    pub fn take_dropped(&mut self) -> Vec<PayloadRef> {
        std::mem::take(&mut self.dropped)
    }

    /// Files continuation slots read in one batch: at most the number owed ([`Self::wants`]
    /// asked for no more), as [`Self::push`] would one by one.
    pub fn push_owed(&mut self, slots: &[Message]) {
        let take = slots.len().min(self.owed);
        self.queue.extend(&slots[..take]);
        self.owed -= take;
    }

    /// Puts back a one-slot message taken straight from the ring, when nothing was queued (see
    /// [`Incoming::take_slot`]): it is the next message again.
    pub(super) fn put_back(&mut self, slot: Message) {
        debug_assert!(
            self.is_empty(),
            "a slot is put back only into an empty inbox"
        );
        self.queue.push_back(slot);
    }

    /// The first queued group that `expect` selects, once it is whole: its index, or `None`.
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] for a chunk that no header announced, or a pipelined message cut off
    /// by another.
    pub fn find(&self, expect: Expect) -> Result<Option<usize>, Error> {
        let peer = self.peer;
        let queue = &self.queue;
        let mut at = 0;
        while let Some(header) = queue.get(at) {
            if header.kind == kind::CHUNK {
                return Err(Error::Protocol {
                    peer,
                    detail: format!(
                        "a chunk (tag {}) that no pipelined message announced; expected a message \
                         header",
                        header.tag
                    ),
                });
            }
            let eager = header.kind & !kind::OP_MASK == 0;
            let extent = 1 + kind::continuation_slots(header.len as usize);
            if eager && at + extent > queue.len() {
                // Its continuation is still owed: the last group, and not whole yet.
                return Ok(None);
            }
            if expect.selects(header) {
                return Ok(Some(at));
            }
            at += match header.kind & !kind::OP_MASK {
                0 => extent,
                flags if flags & kind::PIPELINED != 0 => {
                    let total = u64::from_le_bytes(header.inline[..8].try_into().unwrap_or([0; 8]));
                    let mut seen = 0u64;
                    let mut next = at + 1;
                    while seen < total {
                        let Some(chunk) = queue.get(next) else {
                            // The rest of this message is still in the ring: nothing queued
                            // after it.
                            return Ok(None);
                        };
                        if chunk.kind != kind::CHUNK || chunk.tag != header.tag {
                            return Err(Error::Protocol {
                                peer,
                                detail: format!(
                                    "message {} of {total} bytes was cut off after {seen} bytes \
                                     by kind {:#x} tag {}; expected its next chunk",
                                    header.tag, chunk.kind, chunk.tag
                                ),
                            });
                        }
                        seen += u64::from(read_ref(peer, chunk)?.len.max(1));
                        next += 1;
                    }
                    next - at
                }
                _ => 1,
            };
        }
        Ok(None)
    }

    /// The header of the group at `at` (an index [`Self::find`] returned).
    pub(super) fn header(&self, at: usize) -> Message {
        self.queue[at]
    }

    /// Removes the one-slot group at `at` (an index [`Self::find`] returned).
    pub(super) fn remove(&mut self, at: usize) {
        self.queue.remove(at);
    }

    /// Advances `incoming` with what is queued, reading referenced bytes through `payloads`,
    /// without waiting. Returns whether it moved.
    ///
    /// # Errors
    ///
    /// [`Error::CollectiveMismatch`] or [`Error::Protocol`] for a group that is not the one
    /// expected or is malformed, naming the peer; [`Error::BufferTooSmall`] for a kept message
    /// too long for the caller's buffer (it stays queued); what `payloads` returns.
    pub fn step(
        &mut self,
        incoming: &mut Incoming<'_>,
        payloads: &mut impl Payloads,
    ) -> Result<bool, Error> {
        let peer = self.peer;
        debug_assert_eq!(
            incoming.peer, peer,
            "a receive steps through its own peer's inbox"
        );
        let mut moved = false;
        loop {
            match incoming.state {
                InState::Done { .. } => return Ok(moved),
                InState::Header => {
                    let Some(at) = self.find(incoming.expect)? else {
                        return Ok(moved);
                    };
                    let header = self.queue[at];
                    incoming.expect.check(peer, &header)?;
                    incoming.refuse_too_long(&header)?;
                    moved = true;
                    if header.kind & RESUMED != 0 {
                        incoming.state = self.resume(at, &header, &mut incoming.sink)?;
                        self.taking = Some(Taking {
                            tag: header.tag,
                            at,
                            point_to_point: header.kind & kind::OP_MASK == kind::SEND,
                        });
                        continue;
                    }
                    incoming.state = match transport(peer, &header)? {
                        0 => self.take_eager(at, &header, &mut incoming.sink)?,
                        kind::PIPELINED => {
                            let (total, rest) = header.inline.split_at(8);
                            let total = u64::from_le_bytes(total.try_into().unwrap_or([0; 8]));
                            if header.len != 0 || rest.iter().any(|&b| b != 0) {
                                return Err(Error::Protocol {
                                    peer,
                                    detail: "a pipelined header must hold only the total length"
                                        .into(),
                                });
                            }
                            let fits = incoming.sink.prepare(peer, total)?;
                            self.queue.remove(at);
                            self.taking = Some(Taking {
                                tag: header.tag,
                                at,
                                point_to_point: header.kind & kind::OP_MASK == kind::SEND,
                            });
                            InState::Chunks {
                                at,
                                tag: header.tag,
                                total,
                                done: 0,
                                fits,
                            }
                        }
                        _ => {
                            let lent = read_ref(peer, &header)?;
                            let len = u64::from(lent.len);
                            let fits = incoming.sink.prepare(peer, len)?;
                            if fits {
                                let window = incoming.sink.window(0, lent.len as usize);
                                payloads.read_into(lent, window)?;
                            }
                            self.queue.remove(at);
                            payloads.ack(lent)?;
                            InState::Done { len, fits }
                        }
                    };
                }
                InState::Chunks {
                    at,
                    tag,
                    total,
                    done,
                    fits,
                } => {
                    let at = self.taking_at(tag, at);
                    if done == total {
                        self.taking = None;
                        incoming.state = InState::Done { len: total, fits };
                        continue;
                    }
                    let Some(&chunk) = self.queue.get(at) else {
                        return Ok(moved);
                    };
                    // Another message where the next chunk belongs: its sender gave up on this
                    // one (said as such, not as a malformed reference).
                    let piece = if chunk.kind == kind::CHUNK && chunk.tag == tag {
                        read_ref(peer, &chunk)?
                    } else {
                        bytemuck::Zeroable::zeroed()
                    };
                    let len = u64::from(piece.len);
                    if chunk.kind != kind::CHUNK
                        || chunk.tag != tag
                        || len == 0
                        || len > total - done
                    {
                        return Err(Error::Protocol {
                            peer,
                            detail: format!(
                                "expected a chunk of message {tag} with 1 to {} bytes, found kind {:#x} tag {} with {len} bytes",
                                total - done,
                                chunk.kind,
                                chunk.tag
                            ),
                        });
                    }
                    if fits {
                        let window = incoming.sink.window(done as usize, piece.len as usize);
                        payloads.read_into(piece, window)?;
                    }
                    self.queue.remove(at);
                    payloads.ack(piece)?;
                    moved = true;
                    incoming.state = InState::Chunks {
                        at,
                        tag,
                        total,
                        done: done + len,
                        fits,
                    };
                }
            }
        }
    }

    /// Sets aside `incoming`, a receive that ends between the chunks of a pipelined message: the
    /// bytes it has are kept, and a resumption header takes the place of the message's own, so
    /// that the next receive selecting the message starts where this one stopped. `incoming` is
    /// left with an empty sink. Does nothing to a receive that is not between chunks.
    pub fn set_aside(&mut self, incoming: &mut Incoming<'_>) {
        let InState::Chunks {
            at,
            tag,
            total,
            done,
            fits,
        } = incoming.state
        else {
            return;
        };
        let bytes = fits.then(|| {
            let done = usize::try_from(done).unwrap_or(usize::MAX);
            match std::mem::replace(&mut incoming.sink, Sink::Vec(Vec::new())) {
                Sink::Vec(mut bytes) => {
                    bytes.truncate(done);
                    bytes
                }
                Sink::Slice(buffer) => buffer[..done].to_vec(),
            }
        });
        let op = match incoming.expect {
            Expect::Send { .. } => kind::SEND,
            Expect::Collective { op, .. } => op,
        };
        let mut inline = [0u8; INLINE_BYTES];
        inline[..8].copy_from_slice(&(total - done).to_le_bytes());
        inline[8..16].copy_from_slice(&total.to_le_bytes());
        let header = message(op | kind::PIPELINED | RESUMED, tag, 0, inline);
        let at = self.taking_at(tag, at);
        self.queue.insert(at, header);
        self.taking = None;
        self.partial = Some(Box::new(Partial { tag, total, bytes }));
        incoming.state = InState::Header;
    }

    /// Ends `incoming`, a collective's receive that failed between the chunks of a pipelined
    /// message (a deadline, an interrupt, a departure seen on another link). Nobody will receive
    /// the rest of that message: a collective is never called again with its number. So its
    /// chunks that are queued go now, and those still to come go as they come, up to the next
    /// header (the sender gave up on it then); their blocks are handed out by
    /// [`Self::take_dropped`], to be acknowledged. Otherwise the next receive from this peer
    /// would find a chunk where a header belongs and fail, naming a peer that did nothing wrong.
    ///
    /// Does nothing to a receive that is not between chunks, or whose message
    /// [`Self::close_stream`] has dropped already. `incoming` is left at its header.
    pub fn abandon(&mut self, incoming: &mut Incoming<'_>) {
        let InState::Chunks { tag, at, .. } = incoming.state else {
            return;
        };
        incoming.state = InState::Header;
        if self
            .taking
            .is_some_and(|taking| taking.tag == tag && taking.at == self.taking_at(tag, at))
            && let Some(rest) = self.drop_taken()
        {
            self.orphans = Some(rest);
        }
    }

    /// Takes up the set-aside message whose resumption header is at `queue[at]`: its bytes so far
    /// go into `sink`, and the receive goes on with its next chunk.
    fn resume(
        &mut self,
        at: usize,
        header: &Message,
        sink: &mut Sink<'_>,
    ) -> Result<InState, Error> {
        let partial = match self.partial.take() {
            Some(partial) if partial.tag == header.tag => partial,
            other => {
                self.partial = other;
                return Err(Error::Misuse(format!(
                    "rank {}'s message {} was set aside, and nothing of it was kept",
                    self.peer, header.tag
                )));
            }
        };
        let remaining = u64::from_le_bytes(header.inline[..8].try_into().unwrap_or([0; 8]));
        let done = partial.total - remaining;
        let fits = sink.prepare(self.peer, partial.total)? && partial.bytes.is_some();
        if let (true, Some(bytes)) = (fits, &partial.bytes) {
            sink.window(0, bytes.len()).copy_from_slice(bytes);
        }
        self.queue.remove(at);
        Ok(InState::Chunks {
            at,
            tag: header.tag,
            total: partial.total,
            done,
            fits,
        })
    }

    /// Copies out the eager group at `queue[at]` and removes it.
    fn take_eager(
        &mut self,
        at: usize,
        header: &Message,
        sink: &mut Sink<'_>,
    ) -> Result<InState, Error> {
        let len = header.len as usize;
        let slots = kind::continuation_slots(len);
        let fits = sink.prepare(self.peer, len as u64)?;
        let queue = &mut self.queue;
        let end = (at + 1 + slots).min(queue.len());
        if fits {
            copy_eager(sink.window(0, len), header, queue.range(at + 1..end));
        }
        queue.drain(at..end);
        Ok(InState::Done {
            len: len as u64,
            fits,
        })
    }
}

/// Whether `slot` heads an eager message of a known operation (no flags): what may be taken
/// straight from the ring. Anything else (a chunk, an unknown kind) goes to the inbox, which
/// says what is wrong with it.
fn plain_eager(slot: &Message) -> bool {
    slot.kind & !kind::OP_MASK == 0 && frame::known_op(slot.kind)
}

/// Copies an eager message into `out` (its length): the header's inline bytes, then the
/// continuation slots' raw bytes, as far as `out` goes.
fn copy_eager<'m>(
    out: &mut [u8],
    header: &Message,
    continuation: impl IntoIterator<Item = &'m Message>,
) {
    let head = out.len().min(INLINE_BYTES);
    out[..head].copy_from_slice(&header.inline[..head]);
    let mut filled = head;
    for slot in continuation {
        let bytes = bytemuck::bytes_of(slot);
        let take = (out.len() - filled).min(bytes.len());
        out[filled..filled + take].copy_from_slice(&bytes[..take]);
        filled += take;
    }
}

#[cfg(test)]
mod tests;
