//! The owner's outbox ledger and the reference checks, driven by arbitrary peer messages against
//! a simple model: which blocks were sent to whom, which acknowledgements must be taken, which
//! refused, and which references lie inside the outbox.
//!
//! Each input is a list of 8-byte operations on a fresh 64 KiB outbox:
//! `[op, a, b, c, d0, d1, d2, d3]`:
//! * op 0: allocate `a * 64 + b` bytes and send them to the ranks in mask `c & 0xf`;
//! * op 1: rank `a & 3` acknowledges block number `b` exactly as it was sent;
//! * op 2: rank `a & 3` acknowledges a forged reference (offset from `d`, length `b * 256 + c`,
//!   padding `a >> 4`);
//! * op 3: rank `a & 3` dies: it is forgotten;
//! * op 4: a reference from `d`, `b`, `c`, `a` is checked against the outbox's bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker_allocator::{Outbox, check_ref};
use shmbroker_bindings::{OUTBOX_HEADER_BYTES, PayloadRef};
use std::collections::HashMap;

const SIZE: u64 = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let mut outbox = Outbox::create(0, SIZE).expect("an outbox");
    let capacity = outbox.free_bytes();
    // The model: every block sent, by offset, with the ranks that still owe for it.
    let mut model: HashMap<u64, (PayloadRef, u64, u8)> = HashMap::new();
    let mut sent: Vec<PayloadRef> = Vec::new();
    for op in data.chunks_exact(8) {
        let (a, b, c) = (op[1], op[2], op[3]);
        let d = u32::from_le_bytes([op[4], op[5], op[6], op[7]]);
        match op[0] % 5 {
            0 => {
                let len = u64::from(a) * 64 + u64::from(b);
                let mask = c & 0xf;
                let Some(block) = outbox.try_alloc(len).expect("fits the outbox") else {
                    continue;
                };
                let block_len = block.len();
                assert!(block_len >= len && block_len % 64 == 0);
                let payload = outbox
                    .send(block, len, u64::from(mask))
                    .expect("a block takes its own length");
                sent.push(payload);
                if mask != 0 {
                    assert!(
                        model
                            .insert(payload.offset, (payload, block_len, mask))
                            .is_none(),
                        "one block handed out twice"
                    );
                }
            }
            1 | 2 => {
                let rank = u32::from(a & 3);
                let acked = if op[0] % 5 == 1 {
                    let Some(&payload) = sent.get(usize::from(b)) else {
                        continue;
                    };
                    payload
                } else {
                    PayloadRef {
                        offset: u64::from(d),
                        len: u32::from(b) * 256 + u32::from(c),
                        _pad0: u32::from(a >> 4),
                    }
                };
                let expected = match model.get_mut(&acked.offset) {
                    Some((payload, _, owed)) if *payload == acked && *owed & (1 << rank) != 0 => {
                        *owed &= !(1 << rank);
                        Some(*owed == 0)
                    }
                    _ => None,
                };
                match (outbox.ack(rank, acked), expected) {
                    (Ok(freed), Some(model_freed)) => {
                        assert_eq!(freed, model_freed);
                        if freed {
                            model.remove(&acked.offset);
                        }
                    }
                    (Err(_), None) => {}
                    (outcome, expected) => {
                        panic!("ack {acked:?} from {rank}: {outcome:?}, model says {expected:?}")
                    }
                }
            }
            3 => {
                let rank = a & 3;
                outbox.forget(u32::from(rank));
                model.retain(|_, (_, _, owed)| {
                    *owed &= !(1 << rank);
                    *owed != 0
                });
            }
            _ => {
                let payload = PayloadRef {
                    offset: u64::from(d) | (u64::from(a) << 32),
                    len: u32::from(b) << 8 | u32::from(c),
                    _pad0: u32::from(a & 1),
                };
                let inside = payload._pad0 == 0
                    && payload.offset >= OUTBOX_HEADER_BYTES
                    && payload.offset + u64::from(payload.len) <= SIZE;
                assert_eq!(check_ref(0, payload, SIZE).is_ok(), inside, "{payload:?}");
            }
        }
        // Nothing lost, nothing freed twice: what is free plus what is owed is all there is.
        assert_eq!(outbox.blocks_owed(), model.len());
        let owed: u64 = model.values().map(|&(_, len, _)| len).sum();
        assert_eq!(outbox.free_bytes() + owed, capacity);
    }
});
