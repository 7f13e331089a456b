//! The frames of a peer's ring: what a slot says, checked, with no state. The demultiplexer
//! (the parent module) groups slots into messages with these.

use crate::error::Error;
use shmbroker_bindings::{INLINE_BYTES, Message, PayloadRef, kind};

/// The flag of a resumption header (see [`super::Inbox::set_aside`]): never valid on the wire.
pub(super) const RESUMED: u32 = 1 << 31;

pub use crate::tag::stream_of;

/// Which group a receive takes from a peer's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The first non-`SEND` group of `seq`'s stream, which must be operation `op` number `seq`.
    Collective {
        /// The operation (`kind::BARRIER`, ...).
        op: u32,
        /// The collective's sequence number.
        seq: u64,
    },
    /// The first `SEND` group, which must carry point-to-point number `tag`.
    Send {
        /// The point-to-point number due.
        tag: u64,
    },
}

impl Expect {
    /// Whether `message` (a group's header) is of the kind this receive takes.
    pub(crate) fn selects(self, message: &Message) -> bool {
        let op = message.kind & kind::OP_MASK;
        match self {
            // A collective takes only messages of its own stream (the world's or a group's:
            // see `session::groups`), so collectives on different groups never mix.
            Self::Collective { seq, .. } => {
                op != kind::SEND && stream_of(message.tag) == stream_of(seq)
            }
            Self::Send { .. } => op == kind::SEND,
        }
    }

    /// Whether `header` (a group [`Self::selects`]) is the one expected, naming what differs.
    pub(crate) fn check(self, peer: u32, header: &Message) -> Result<(), Error> {
        let op = header.kind & kind::OP_MASK;
        match self {
            Self::Collective { op: want, seq } if op != want || header.tag != seq => {
                Err(Error::CollectiveMismatch {
                    peer,
                    expected_kind: want,
                    expected_seq: seq,
                    found_kind: op,
                    found_seq: header.tag,
                })
            }
            Self::Send { tag } if header.tag != tag => Err(Error::Protocol {
                peer,
                detail: format!("message number {} arrived where {tag} was due", header.tag),
            }),
            _ => Ok(()),
        }
    }
}

/// Where the bytes of an incoming message go.
#[derive(Debug)]
pub enum Sink<'a> {
    /// A vector sized when the header says how much is coming.
    Vec(Vec<u8>),
    /// A caller's buffer; a longer message is read to its end and reported as too large for it.
    Slice(&'a mut [u8]),
}

impl Sink<'_> {
    /// Makes room for `len` bytes; `false` when they cannot all be kept.
    pub(super) fn prepare(&mut self, peer: u32, len: u64) -> Result<bool, Error> {
        match self {
            Self::Vec(bytes) => {
                let len = usize::try_from(len).map_err(|_| too_big(peer, len))?;
                bytes.clear();
                bytes
                    .try_reserve_exact(len)
                    .map_err(|_| too_big(peer, len as u64))?;
                Ok(true)
            }
            Self::Slice(buffer) => Ok(len <= buffer.len() as u64),
        }
    }

    /// The `len` bytes from `at` on, to be filled (after a successful [`Self::prepare`]).
    pub(super) fn window(&mut self, at: usize, len: usize) -> &mut [u8] {
        match self {
            Self::Vec(bytes) => {
                if bytes.len() < at + len {
                    bytes.resize(at + len, 0);
                }
                &mut bytes[at..at + len]
            }
            Self::Slice(buffer) => &mut buffer[at..at + len],
        }
    }

    /// The bytes received into a vector sink.
    ///
    /// # Panics
    ///
    /// For a slice sink: callers know which kind they made.
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self {
            Self::Vec(bytes) => bytes,
            Self::Slice(_) => unreachable!("a vector sink stays a vector"),
        }
    }
}

fn too_big(peer: u32, len: u64) -> Error {
    Error::Protocol {
        peer,
        detail: format!(
            "announced a message of {len} bytes; this process could not reserve that much memory"
        ),
    }
}

pub(crate) fn message(kind: u32, tag: u64, len: u32, inline: [u8; INLINE_BYTES]) -> Message {
    Message {
        kind,
        len,
        tag,
        inline,
    }
}

/// A message whose `inline` holds `payload` and zeros.
pub(crate) fn with_ref(kind: u32, tag: u64, payload: PayloadRef) -> Message {
    let mut inline = [0u8; INLINE_BYTES];
    inline[..size_of::<PayloadRef>()].copy_from_slice(bytemuck::bytes_of(&payload));
    message(kind, tag, 0, inline)
}

/// What a loan message's `inline` may say after its reference (bytes 16..32, two little-endian
/// `u64`s; zero where unsaid). A collective's lender says both, so that a receiver that passed
/// another length tells, whatever the pieces it was cut into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LoanNote {
    /// The length of the whole contribution the loan is a part of, when the lender lends each
    /// peer only the bytes it reads (0: the loan is the whole contribution).
    pub(crate) part_of: u64,
    /// The bytes of the whole collective call the loan is a piece of (0: not a collective's).
    pub(crate) call: u64,
}

/// Where a [`LoanNote`] lies in a loan message's `inline`.
const NOTE: std::ops::Range<usize> = size_of::<PayloadRef>()..size_of::<PayloadRef>() + 16;

/// [`with_ref`] of a loan with `note` after its reference.
pub(crate) fn with_loan_ref(kind: u32, tag: u64, payload: PayloadRef, note: LoanNote) -> Message {
    let mut message = with_ref(kind, tag, payload);
    message.inline[NOTE.start..NOTE.start + 8].copy_from_slice(&note.part_of.to_le_bytes());
    message.inline[NOTE.start + 8..NOTE.end].copy_from_slice(&note.call.to_le_bytes());
    message
}

/// The [`LoanNote`] of a loan message (all zero for any other).
pub(crate) fn loan_note(message: &Message) -> LoanNote {
    if message.kind & kind::LOAN == 0 {
        return LoanNote::default();
    }
    let word =
        |at: usize| u64::from_le_bytes(message.inline[at..at + 8].try_into().unwrap_or([0; 8]));
    LoanNote {
        part_of: word(NOTE.start),
        call: word(NOTE.start + 8),
    }
}

/// The reference in a message's `inline`, after checking that the rest of it is zero (but for a
/// loan's [`LoanNote`]).
pub(crate) fn read_ref(peer: u32, message: &Message) -> Result<PayloadRef, Error> {
    let (head, rest) = message.inline.split_at(size_of::<PayloadRef>());
    let rest = if message.kind & kind::LOAN != 0 {
        &rest[NOTE.len()..]
    } else {
        rest
    };
    if message.len != 0 || rest.iter().any(|&b| b != 0) {
        return Err(Error::Protocol {
            peer,
            detail: format!(
                "a reference message (kind {:#x}) must have len 0 and zeros after the reference; \
                 found len {} and {} nonzero bytes",
                message.kind,
                message.len,
                rest.iter().filter(|&&b| b != 0).count()
            ),
        });
    }
    Ok(bytemuck::pod_read_unaligned(head))
}

/// The length of the message `header` opens, as it announces it (a group [`super::Inbox::find`]
/// returned).
pub(crate) fn message_len(peer: u32, header: &Message) -> Result<u64, Error> {
    if header.kind & RESUMED != 0 {
        // The whole message's length: a resumption header holds it after what remains.
        return Ok(u64::from_le_bytes(
            header.inline[8..16].try_into().unwrap_or([0; 8]),
        ));
    }
    Ok(match transport(peer, header)? {
        0 => u64::from(header.len),
        kind::PIPELINED => u64::from_le_bytes(header.inline[..8].try_into().unwrap_or([0; 8])),
        _ => u64::from(read_ref(peer, header)?.len),
    })
}

/// The transport flags of a kind, checked: eager (0), pipelined or loan, and nothing else.
pub(crate) fn transport(peer: u32, message: &Message) -> Result<u32, Error> {
    let flags = message.kind & !kind::OP_MASK;
    if known_op(message.kind) && matches!(flags, 0 | kind::PIPELINED | kind::LOAN) {
        Ok(flags)
    } else {
        Err(Error::Protocol {
            peer,
            detail: format!("unknown message kind {:#x}", message.kind),
        })
    }
}

/// Whether the operation of `message_kind` (its flags aside) is one a message may carry.
pub(crate) fn known_op(message_kind: u32) -> bool {
    matches!(
        message_kind & kind::OP_MASK,
        kind::BARRIER
            | kind::ALL_GATHER
            | kind::BROADCAST
            | kind::SEND
            | kind::FD_TICKET
            | kind::GATHER
            | kind::ALL_REDUCE
            | kind::REDUCE_SCATTER
            | kind::REDUCE
            | kind::SCATTER
            | kind::ALL_TO_ALL
            | kind::GROUP
            | kind::SHRINK
    )
}
