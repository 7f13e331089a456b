//! The demultiplexer (`shmbroker::session::demux`), fed arbitrary slot sequences from one peer
//! and receives of every kind, against a model of what an honest peer sent.
//!
//! Each input is a list of operations, one byte of kind then its operands:
//! * 0: a raw slot: the next 64 bytes, whatever they hold (after this, contents are unchecked);
//! * 1: an honest eager `SEND` of `a * 64 + b` bytes (at most the eager limit);
//! * 2: an honest pipelined `SEND` of `a * 64 + b + 1` bytes in chunks of `c * 16 + 1`, its
//!   chunks pushed `d % 4` at a time (0: all) and the rest one per receive, so that receives
//!   see it in pieces;
//! * 3: an honest loan `SEND` of `a * 16` bytes at offset `b * 16`;
//! * 4: a point-to-point receive of the next number due, into a vector (`a` even) or a buffer of
//!   `b * 64` bytes that keeps a message too long for it;
//! * 5: a collective receive of operation `a % 8` number `b`, into a vector or a buffer of `c`;
//!   one that does not complete is abandoned, as a collective that fails is;
//! * 6: an honest collective (the next all-gather: eager of `b` bytes for an even `a`, else
//!   pipelined, `b * 16 + 1` bytes in chunks of 64 arriving one per later operation);
//! * 7: stream `a % 3` closed, as when a member departs (stream 0 is the honest collectives').
//!
//! Invariants: nothing panics; every refusal names the peer; point-to-point messages are delivered
//! in order, each at most once; a run of honest slots only is delivered byte for byte with no
//! refusal but a buffer too small (which keeps the message), closing streams included (they drop
//! collectives, never a point-to-point message); nothing is acknowledged that was not sent by
//! reference, nor twice more than it was sent, counting what closing streams and abandoned
//! receives drop.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker::Error;
use shmbroker::session::demux::{Expect, Inbox, Incoming, Payloads, Sink};
use shmbroker_bindings::{INLINE_BYTES, Message, PayloadRef, kind};
use std::collections::HashMap;

const PEER: u32 = 2;
const REGION: usize = 8192;

/// The peer's outbox as a buffer, counting acknowledgements by offset.
struct Region {
    bytes: Vec<u8>,
    acks: HashMap<u64, u32>,
}

impl Payloads for Region {
    fn read_into(&mut self, payload: PayloadRef, out: &mut [u8]) -> Result<(), Error> {
        let start = usize::try_from(payload.offset).unwrap_or(usize::MAX);
        let bytes = start
            .checked_add(payload.len as usize)
            .and_then(|end| self.bytes.get(start..end))
            .ok_or_else(|| Error::Protocol {
                peer: PEER,
                detail: "a reference outside the outbox".into(),
            })?;
        assert_eq!(out.len(), bytes.len(), "a window of the reference's length");
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn ack(&mut self, payload: PayloadRef) -> Result<(), Error> {
        *self.acks.entry(payload.offset).or_default() += 1;
        Ok(())
    }
}

fn slot(kind: u32, tag: u64, len: u32) -> Message {
    Message {
        kind,
        len,
        tag,
        inline: [0; INLINE_BYTES],
    }
}

fn with_ref(kind: u32, tag: u64, offset: u64, len: u32) -> Message {
    let mut message = slot(kind, tag, 0);
    let payload = PayloadRef {
        offset,
        len,
        _pad0: 0,
    };
    message.inline[..16].copy_from_slice(bytemuck::bytes_of(&payload));
    message
}

fn eager(op: u32, tag: u64, data: &[u8]) -> Vec<Message> {
    let mut slots = vec![slot(op, tag, data.len() as u32)];
    let head = data.len().min(INLINE_BYTES);
    slots[0].inline[..head].copy_from_slice(&data[..head]);
    for piece in data[head..].chunks(size_of::<Message>()) {
        let mut raw = slot(0, 0, 0);
        bytemuck::bytes_of_mut(&mut raw)[..piece.len()].copy_from_slice(piece);
        slots.push(raw);
    }
    slots
}

struct Model {
    inbox: Inbox,
    region: Region,
    /// Only honest slots so far: what is delivered must be exactly what was sent.
    honest: bool,
    /// Point-to-point number of the next honest message to send, and the next due.
    sent: u64,
    due: u64,
    /// What each honest point-to-point message carries, by number.
    contents: HashMap<u64, Vec<u8>>,
    /// Number of the next honest collective.
    collectives_sent: u64,
    /// Honest collectives sent and not yet received, by number.
    collectives: HashMap<u64, Vec<u8>>,
    /// Chunks of the last pipelined message not yet arrived.
    pending: std::collections::VecDeque<Message>,
    /// References sent per offset (acknowledgements may not exceed them).
    lent: HashMap<u64, u32>,
}

impl Model {
    /// Files `slots`; an error ends the run (the session would be dropped).
    /// Files `slots` after every chunk still pending (a peer writes a message's chunks before
    /// its next message).
    fn push(&mut self, slots: &[Message]) -> Result<(), Error> {
        let pending: Vec<Message> = self.pending.drain(..).collect();
        for &slot in pending.iter().chain(slots) {
            self.inbox.check_room()?;
            if let Some(acked) = self.inbox.push(slot)? {
                // An acknowledgement goes to the outbox ledger; nothing here to model.
                let _ = acked;
            }
            self.ack_dropped();
        }
        Ok(())
    }

    /// Acknowledges what closing streams dropped, as the session does.
    fn ack_dropped(&mut self) {
        for piece in self.inbox.take_dropped() {
            let _ = self.region.ack(piece);
        }
    }

    /// Receives what `expect` selects after one more pending chunk (if any) arrived.
    fn receive(&mut self, expect: Expect, sink: Sink<'_>, keep: bool) -> Result<(), Error> {
        if let Some(chunk) = self.pending.pop_front() {
            self.inbox.check_room()?;
            self.inbox.push(chunk)?;
            self.ack_dropped();
        }
        let mut incoming = if keep {
            Incoming::keeping_too_long(PEER, expect, sink)
        } else {
            Incoming::new(PEER, expect, sink)
        };
        self.inbox.step(&mut incoming, &mut self.region)?;
        if !incoming.is_done() {
            // Not whole yet (or nothing there). A real receive would wait; this one is ended as
            // an interrupt or a deadline ends one: a point-to-point receive is set aside, for
            // the next receive to resume; a collective's is abandoned, its message lost.
            match expect {
                Expect::Send { .. } => self.inbox.set_aside(&mut incoming),
                Expect::Collective { seq, .. } => {
                    if incoming.mid_transfer() {
                        self.collectives.remove(&seq);
                    }
                    self.inbox.abandon(&mut incoming);
                    self.ack_dropped();
                }
            }
            return Ok(());
        }
        let (len, sink) = incoming.finish()?;
        let bytes: Vec<u8> = match sink {
            Sink::Vec(bytes) => bytes,
            Sink::Slice(buffer) => buffer[..len as usize].to_vec(),
        };
        assert_eq!(
            bytes.len() as u64,
            len,
            "the length delivered is the length announced"
        );
        match expect {
            Expect::Send { tag } => {
                assert_eq!(tag, self.due, "delivered in order");
                self.due += 1;
                if self.honest {
                    assert_eq!(
                        self.contents.remove(&tag).as_deref(),
                        Some(&bytes[..]),
                        "message {tag} delivered byte for byte, once"
                    );
                }
            }
            Expect::Collective { seq, .. } => {
                if self.honest {
                    assert_eq!(
                        self.collectives.remove(&seq).as_deref(),
                        Some(&bytes[..]),
                        "collective {seq} delivered byte for byte, once"
                    );
                }
            }
        }
        Ok(())
    }
}

/// Operands, zero past the end.
fn operands<const N: usize>(data: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let take = N.min(data.len());
    out[..take].copy_from_slice(&data[..take]);
    *data = &data[take..];
    out
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let mut model = Model {
        inbox: Inbox::new(PEER),
        region: Region {
            bytes: (0..REGION).map(|i| (i * 31 + 7) as u8).collect(),
            acks: HashMap::new(),
        },
        honest: true,
        sent: 0,
        due: 0,
        contents: HashMap::new(),
        collectives_sent: 0,
        collectives: HashMap::new(),
        lent: HashMap::new(),
        pending: std::collections::VecDeque::new(),
    };
    let mut buffer = vec![0u8; 255 * 64];
    while let Some((&op, rest)) = data.split_first() {
        data = rest;
        let result = match op % 8 {
            0 => {
                let raw: [u8; 64] = operands(&mut data);
                model.honest = false;
                model.push(&[bytemuck::pod_read_unaligned(&raw)])
            }
            1 => {
                let [a, b] = operands(&mut data);
                let len = (usize::from(a) * 64 + usize::from(b)).min(kind::EAGER_MAX);
                let tag = model.sent;
                let bytes: Vec<u8> = (0..len).map(|i| (i as u64 ^ tag) as u8).collect();
                model.sent += 1;
                model.contents.insert(tag, bytes.clone());
                model.push(&eager(kind::SEND, tag, &bytes))
            }
            2 => {
                let [a, b, c, d] = operands(&mut data);
                let total = (usize::from(a) * 64 + usize::from(b) + 1).min(REGION);
                let chunk = usize::from(c) * 16 + 1;
                let tag = model.sent;
                model.sent += 1;
                model
                    .contents
                    .insert(tag, model.region.bytes[..total].to_vec());
                let mut inline = [0u8; INLINE_BYTES];
                inline[..8].copy_from_slice(&(total as u64).to_le_bytes());
                let mut slots = vec![Message {
                    kind: kind::SEND | kind::PIPELINED,
                    len: 0,
                    tag,
                    inline,
                }];
                let mut at = 0;
                while at < total {
                    let len = chunk.min(total - at);
                    *model.lent.entry(at as u64).or_default() += 1;
                    slots.push(with_ref(kind::CHUNK, tag, at as u64, len as u32));
                    at += len;
                }
                // The rest of the chunks come with later operations (as `pending`).
                let now = match d % 4 {
                    0 => slots.len(),
                    n => usize::from(n).min(slots.len()),
                };
                let pushed = model.push(&slots[..now]);
                model.pending.extend(&slots[now..]);
                pushed
            }
            3 => {
                let [a, b] = operands(&mut data);
                let (len, offset) = (usize::from(a) * 16, usize::from(b) * 16);
                let tag = model.sent;
                model.sent += 1;
                model
                    .contents
                    .insert(tag, model.region.bytes[offset..offset + len].to_vec());
                *model.lent.entry(offset as u64).or_default() += 1;
                model.push(&[with_ref(
                    kind::SEND | kind::LOAN,
                    tag,
                    offset as u64,
                    len as u32,
                )])
            }
            4 => {
                let [a, b] = operands(&mut data);
                let expect = Expect::Send { tag: model.due };
                if a % 2 == 0 {
                    model.receive(expect, Sink::Vec(Vec::new()), true)
                } else {
                    let len = usize::from(b) * 64;
                    model.receive(expect, Sink::Slice(&mut buffer[..len]), true)
                }
            }
            5 => {
                let [a, b, c] = operands(&mut data);
                let expect = Expect::Collective {
                    op: u32::from(a % 8),
                    seq: u64::from(b),
                };
                if c == 0 {
                    model.receive(expect, Sink::Vec(Vec::new()), false)
                } else {
                    model.receive(expect, Sink::Slice(&mut buffer[..usize::from(c)]), false)
                }
            }
            7 => {
                let [a] = operands(&mut data);
                model.inbox.close_stream(u32::from(a % 3));
                model.ack_dropped();
                Ok(())
            }
            _ => {
                let [a, b] = operands(&mut data);
                let seq = model.collectives_sent;
                model.collectives_sent += 1;
                if a % 2 == 0 {
                    let bytes: Vec<u8> = (0..b).map(|i| i ^ a).collect();
                    model.collectives.insert(seq, bytes.clone());
                    model.push(&eager(kind::ALL_GATHER, seq, &bytes))
                } else {
                    let total = usize::from(b) * 16 + 1;
                    model
                        .collectives
                        .insert(seq, model.region.bytes[..total].to_vec());
                    let mut inline = [0u8; INLINE_BYTES];
                    inline[..8].copy_from_slice(&(total as u64).to_le_bytes());
                    let header = Message {
                        kind: kind::ALL_GATHER | kind::PIPELINED,
                        len: 0,
                        tag: seq,
                        inline,
                    };
                    let pushed = model.push(&[header]);
                    for at in (0..total).step_by(64) {
                        let len = 64.min(total - at);
                        *model.lent.entry(at as u64).or_default() += 1;
                        model
                            .pending
                            .push_back(with_ref(kind::CHUNK, seq, at as u64, len as u32));
                    }
                    pushed
                }
            }
        };
        match result {
            Ok(()) => {}
            Err(error) => {
                assert_eq!(
                    error.rank(),
                    Some(PEER),
                    "a refusal names the peer: {error}"
                );
                if model.honest {
                    // Honest slots are refused only for a buffer too small (a kept message
                    // stays queued; a collective is consumed), or a collective received out
                    // of the order it was sent in (a mismatch, as between real ranks).
                    assert!(
                        matches!(
                            error,
                            Error::BufferTooSmall { .. } | Error::CollectiveMismatch { .. }
                        ),
                        "an honest peer refused: {error}"
                    );
                }
                if !matches!(error, Error::BufferTooSmall { .. }) {
                    break;
                }
            }
        }
        // A forged reference is acknowledged too (the owner's ledger refuses it): only an honest
        // run's acknowledgements are bounded by what was lent.
        for (offset, &acks) in model.region.acks.iter().filter(|_| model.honest) {
            assert!(
                acks <= model.lent.get(offset).copied().unwrap_or(0),
                "offset {offset} acknowledged more often than it was sent"
            );
        }
    }
});
