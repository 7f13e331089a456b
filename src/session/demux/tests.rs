//! Every frame kind, and every malformed sequence, through the demultiplexer alone.

use super::*;
use crate::tag::SEQ_BITS;

const PEER: u32 = 3;

/// A peer's outbox as a plain buffer; records the acknowledgements it is sent.
struct Region {
    bytes: Vec<u8>,
    acks: Vec<PayloadRef>,
}

impl Region {
    fn new(len: usize) -> Self {
        Self {
            bytes: (0..len).map(|i| (i * 7 + 1) as u8).collect(),
            acks: Vec::new(),
        }
    }
}

impl Payloads for Region {
    fn read_into(&mut self, payload: PayloadRef, out: &mut [u8]) -> Result<(), Error> {
        let start = usize::try_from(payload.offset).unwrap_or(usize::MAX);
        let bytes = start
            .checked_add(payload.len as usize)
            .and_then(|end| self.bytes.get(start..end))
            .ok_or_else(|| Error::Protocol {
                peer: PEER,
                detail: "out of bounds".into(),
            })?;
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn ack(&mut self, payload: PayloadRef) -> Result<(), Error> {
        self.acks.push(payload);
        Ok(())
    }
}

fn reference(offset: u64, len: u32) -> PayloadRef {
    PayloadRef {
        offset,
        len,
        _pad0: 0,
    }
}

/// The slots of an eager message `op` number `tag` carrying `data`.
fn eager(op: u32, tag: u64, data: &[u8]) -> Vec<Message> {
    let mut slots = vec![message(op, tag, data.len() as u32, [0; INLINE_BYTES])];
    let head = data.len().min(INLINE_BYTES);
    slots[0].inline[..head].copy_from_slice(&data[..head]);
    for piece in data[head..].chunks(size_of::<Message>()) {
        let mut slot = message(0, 0, 0, [0; INLINE_BYTES]);
        bytemuck::bytes_of_mut(&mut slot)[..piece.len()].copy_from_slice(piece);
        slots.push(slot);
    }
    slots
}

/// The slots of a pipelined message of `total` bytes in chunks of `chunk` from offset 0.
fn pipelined(op: u32, tag: u64, total: u64, chunk: u32) -> Vec<Message> {
    let mut inline = [0; INLINE_BYTES];
    inline[..8].copy_from_slice(&total.to_le_bytes());
    let mut slots = vec![message(op | kind::PIPELINED, tag, 0, inline)];
    let mut at = 0;
    while at < total {
        let len = u64::from(chunk).min(total - at);
        slots.push(with_ref(kind::CHUNK, tag, reference(at, len as u32)));
        at += len;
    }
    slots
}

fn inbox_with(slots: &[Message]) -> Inbox {
    let mut inbox = Inbox::new(PEER);
    for &slot in slots {
        assert_eq!(inbox.push(slot).unwrap(), None);
    }
    inbox
}

/// Receives what `expect` selects into a vector, with everything queued.
fn receive(inbox: &mut Inbox, expect: Expect, region: &mut Region) -> Result<Vec<u8>, Error> {
    let mut incoming = Incoming::new(PEER, expect, Sink::Vec(Vec::new()));
    inbox.step(&mut incoming, region)?;
    assert!(incoming.is_done(), "everything was queued");
    Ok(incoming.finish()?.1.into_vec())
}

fn send(tag: u64) -> Expect {
    Expect::Send { tag }
}

fn gather(seq: u64) -> Expect {
    Expect::Collective {
        op: kind::ALL_GATHER,
        seq,
    }
}

/// The error a malformed sequence gets, which must name the peer.
fn refusal(result: Result<impl std::fmt::Debug, Error>) -> String {
    let error = result.expect_err("a malformed sequence is refused");
    assert_eq!(error.rank(), Some(PEER), "{error}");
    error.to_string()
}

#[test]
fn an_eager_message_of_every_slot_count_arrives_whole() {
    let mut region = Region::new(0);
    for len in [0, 1, INLINE_BYTES, INLINE_BYTES + 1, 1000, kind::EAGER_MAX] {
        let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let slots = eager(kind::SEND, 0, &data);
        let mut inbox = Inbox::new(PEER);
        for (at, &slot) in slots.iter().enumerate() {
            // Not whole until its last continuation slot is in.
            assert_eq!(inbox.find(send(0)).unwrap(), None, "len {len} at slot {at}");
            inbox.push(slot).unwrap();
        }
        assert!(!inbox.is_empty());
        assert_eq!(receive(&mut inbox, send(0), &mut region).unwrap(), data);
        assert!(inbox.is_empty());
    }
}

#[test]
fn continuation_slots_are_read_as_bytes_whatever_they_hold() {
    // A continuation slot that looks like an acknowledgement or a chunk is still payload.
    let mut data = vec![0u8; INLINE_BYTES + 2 * size_of::<Message>()];
    data[INLINE_BYTES..INLINE_BYTES + 4].copy_from_slice(&kind::PAYLOAD_ACK.to_le_bytes());
    let at = INLINE_BYTES + size_of::<Message>();
    data[at..at + 4].copy_from_slice(&kind::CHUNK.to_le_bytes());
    let mut inbox = Inbox::new(PEER);
    assert_eq!(inbox.wants(8), 1);
    inbox.push(eager(kind::SEND, 0, &data)[0]).unwrap();
    assert_eq!(inbox.wants(8), 2);
    assert_eq!(inbox.wants(1), 1);
    for &slot in &eager(kind::SEND, 0, &data)[1..] {
        assert_eq!(inbox.push(slot).unwrap(), None);
    }
    assert_eq!(
        receive(&mut inbox, send(0), &mut Region::new(0)).unwrap(),
        data
    );
}

#[test]
fn a_pipelined_message_arrives_whole_and_every_chunk_is_acknowledged() {
    let mut region = Region::new(10_000);
    let mut inbox = inbox_with(&pipelined(kind::ALL_GATHER, 5, 10_000, 3000));
    assert_eq!(
        receive(&mut inbox, gather(5), &mut region).unwrap(),
        region.bytes
    );
    let acked: Vec<u32> = region.acks.iter().map(|r| r.len).collect();
    assert_eq!(acked, [3000, 3000, 3000, 1000]);
    assert!(inbox.is_empty());
}

#[test]
fn a_pipelined_message_is_received_as_its_chunks_come() {
    let mut region = Region::new(300);
    let slots = pipelined(kind::SEND, 0, 300, 100);
    let mut inbox = Inbox::new(PEER);
    let mut incoming = Incoming::new(PEER, send(0), Sink::Vec(Vec::new()));
    assert!(!inbox.step(&mut incoming, &mut region).unwrap());
    for &slot in &slots {
        inbox.push(slot).unwrap();
        assert!(inbox.step(&mut incoming, &mut region).unwrap());
        assert!(incoming.mid_transfer() || incoming.is_done());
    }
    assert!(incoming.is_done());
    assert_eq!(incoming.finish().unwrap().1.into_vec(), region.bytes);
}

#[test]
fn a_loan_is_read_and_acknowledged() {
    let mut region = Region::new(64);
    let mut inbox = inbox_with(&[with_ref(kind::SEND | kind::LOAN, 0, reference(8, 16))]);
    assert_eq!(
        receive(&mut inbox, send(0), &mut region).unwrap(),
        region.bytes[8..24]
    );
    assert_eq!(region.acks, [reference(8, 16)]);
}

#[test]
fn an_acknowledgement_is_handed_over_not_queued() {
    let mut inbox = Inbox::new(PEER);
    let ack = with_ref(kind::PAYLOAD_ACK, 0, reference(64, 10));
    assert_eq!(inbox.push(ack).unwrap(), Some(reference(64, 10)));
    assert!(inbox.is_empty());
    // With junk after its reference it is refused.
    let mut bad = ack;
    bad.inline[40] = 1;
    assert!(refusal(inbox.push(bad)).contains("zeros after the reference"));
}

#[test]
fn receives_take_their_own_kind_and_leave_the_rest_queued_in_order() {
    let mut region = Region::new(1000);
    let mut slots = eager(kind::ALL_GATHER, 0, b"collective");
    slots.extend(pipelined(kind::ALL_GATHER, 1, 1000, 400));
    slots.extend(eager(kind::SEND, 0, b"first"));
    slots.extend(eager(kind::SEND, 1, &[9; 200]));
    let mut inbox = inbox_with(&slots);
    // Point-to-point messages skip the collective groups ahead of them, in order.
    assert_eq!(receive(&mut inbox, send(0), &mut region).unwrap(), b"first");
    assert_eq!(receive(&mut inbox, send(1), &mut region).unwrap(), [9; 200]);
    assert_eq!(inbox.find(send(2)).unwrap(), None);
    assert_eq!(
        receive(&mut inbox, gather(0), &mut region).unwrap(),
        b"collective"
    );
    assert_eq!(
        receive(&mut inbox, gather(1), &mut region).unwrap(),
        region.bytes
    );
    assert!(inbox.is_empty());
}

#[test]
fn a_group_behind_an_unfinished_pipelined_message_is_not_found_yet() {
    let mut slots = pipelined(kind::ALL_GATHER, 0, 1000, 400);
    slots.pop();
    slots.extend(eager(kind::SEND, 0, b"behind"));
    // The SEND header would be read as the third chunk: the message is cut off.
    let inbox = inbox_with(&slots);
    assert!(refusal(inbox.find(send(0))).contains("cut off after 800 bytes"));
    let mut slots = pipelined(kind::ALL_GATHER, 0, 1000, 400);
    slots.pop();
    assert_eq!(inbox_with(&slots).find(send(0)).unwrap(), None);
}

#[test]
fn a_mismatched_collective_or_tag_is_refused_naming_both() {
    let mut region = Region::new(0);
    let mut inbox = inbox_with(&eager(kind::BROADCAST, 7, b"x"));
    let error = refusal(receive(&mut inbox, gather(7), &mut region));
    assert!(
        error.contains("broadcast") && error.contains("all_gather"),
        "{error}"
    );
    let mut inbox = inbox_with(&eager(kind::ALL_GATHER, 8, b"x"));
    assert!(refusal(receive(&mut inbox, gather(7), &mut region)).contains('8'));
    let mut inbox = inbox_with(&eager(kind::SEND, 2, b"x"));
    let error = refusal(receive(&mut inbox, send(1), &mut region));
    assert!(
        error.contains("message number 2 arrived where 1 was due"),
        "{error}"
    );
}

#[test]
fn malformed_headers_are_refused() {
    let unknown_op = message(99, 0, 0, [0; INLINE_BYTES]);
    assert!(refusal(Inbox::new(PEER).push(unknown_op)).contains("unknown message kind"));
    let unknown_flag = message(kind::SEND | 1 << 20, 0, 0, [0; INLINE_BYTES]);
    assert!(refusal(Inbox::new(PEER).push(unknown_flag)).contains("unknown message kind"));
    let too_long = message(kind::SEND, 0, kind::EAGER_MAX as u32 + 1, [0; INLINE_BYTES]);
    assert!(refusal(Inbox::new(PEER).push(too_long)).contains("travel eagerly"));
    let mut chunk = with_ref(kind::CHUNK, 0, reference(0, 1));
    chunk.len = 1;
    assert!(refusal(Inbox::new(PEER).push(chunk)).contains("len 0"));
    let mut loan = with_ref(kind::SEND | kind::LOAN, 0, reference(0, 1));
    loan.inline[40] = 5;
    // A malformed loan reference is queued (its header is a known kind) but refused on receipt,
    // and stays queued.
    let mut inbox = inbox_with(&[loan]);
    assert!(refusal(receive(&mut inbox, send(0), &mut Region::new(8))).contains("reference"));
    assert!(!inbox.is_empty());
    let mut header = pipelined(kind::SEND, 0, 10, 10)[0];
    header.inline[9] = 1;
    let mut inbox = inbox_with(&[header]);
    let error = refusal(receive(&mut inbox, send(0), &mut Region::new(10)));
    assert!(error.contains("only the total length"), "{error}");
}

#[test]
fn a_chunk_that_no_header_announced_is_refused() {
    let inbox = inbox_with(&[with_ref(kind::CHUNK, 0, reference(0, 1))]);
    assert!(refusal(inbox.find(send(0))).contains("no pipelined message announced"));
}

#[test]
fn chunks_of_the_wrong_message_or_size_are_refused() {
    let mut region = Region::new(100);
    let cases = [
        (with_ref(kind::CHUNK, 9, reference(0, 10)), "tag 9"),
        (with_ref(kind::CHUNK, 0, reference(0, 0)), "with 0 bytes"),
        (with_ref(kind::CHUNK, 0, reference(0, 11)), "with 11 bytes"),
    ];
    for (chunk, says) in cases {
        let mut inbox = Inbox::new(PEER);
        inbox.push(pipelined(kind::SEND, 0, 10, 10)[0]).unwrap();
        let mut incoming = Incoming::new(PEER, send(0), Sink::Vec(Vec::new()));
        inbox.step(&mut incoming, &mut region).unwrap();
        assert!(incoming.mid_transfer());
        inbox.push(chunk).unwrap();
        let error = refusal(inbox.step(&mut incoming, &mut region));
        assert!(error.contains(says), "{error}");
    }
}

#[test]
fn a_reference_out_of_bounds_is_the_payloads_refusal() {
    let mut inbox = inbox_with(&pipelined(kind::SEND, 0, 100, 100));
    let error = refusal(receive(&mut inbox, send(0), &mut Region::new(50)));
    assert!(error.contains("out of bounds"), "{error}");
    // The chunk that could not be read was not acknowledged: it stays queued.
    assert!(!inbox.is_empty());
}

#[test]
fn a_kept_message_too_long_for_the_buffer_stays_queued_whole() {
    let data: Vec<u8> = (0..300).map(|i| i as u8).collect();
    for slots in [
        eager(kind::SEND, 0, &data[..40]),
        eager(kind::SEND, 0, &data),
        pipelined(kind::SEND, 0, 300, 100),
        vec![with_ref(kind::SEND | kind::LOAN, 0, reference(0, 300))],
    ] {
        let mut region = Region::new(300);
        region.bytes[..data.len()].copy_from_slice(&data);
        let len = receive(&mut inbox_with(&slots), send(0), &mut region)
            .unwrap()
            .len();
        region.acks.clear();
        let mut inbox = inbox_with(&slots);
        let mut small = vec![0u8; len - 1];
        let mut incoming =
            Incoming::keeping_too_long(PEER, send(0), Sink::Slice(small.as_mut_slice()));
        let error = inbox.step(&mut incoming, &mut region).unwrap_err();
        assert!(
            matches!(error, Error::BufferTooSmall { peer: PEER, needed, capacity }
                if needed == len as u64 && capacity == len - 1),
            "{error}"
        );
        assert!(region.acks.is_empty(), "nothing of it was taken");
        let mut big = vec![0u8; len + 5];
        let mut incoming =
            Incoming::keeping_too_long(PEER, send(0), Sink::Slice(big.as_mut_slice()));
        inbox.step(&mut incoming, &mut region).unwrap();
        let (got, _) = incoming.finish().unwrap();
        assert_eq!(&big[..got as usize], &data[..len]);
        assert!(inbox.is_empty());
    }
}

#[test]
fn a_collective_too_long_for_the_buffer_is_consumed_and_reported() {
    let mut region = Region::new(300);
    let mut inbox = inbox_with(&pipelined(kind::ALL_GATHER, 0, 300, 100));
    inbox.push(eager(kind::ALL_GATHER, 1, b"next")[0]).unwrap();
    let mut small = [0u8; 10];
    let mut incoming = Incoming::new(PEER, gather(0), Sink::Slice(&mut small));
    inbox.step(&mut incoming, &mut region).unwrap();
    assert!(matches!(
        incoming.finish(),
        Err(Error::BufferTooSmall {
            peer: PEER,
            needed: 300,
            capacity: 10
        })
    ));
    assert_eq!(region.acks.len(), 3, "every chunk was given back");
    assert_eq!(
        receive(&mut inbox, gather(1), &mut region).unwrap(),
        b"next"
    );
}

#[test]
fn a_one_slot_message_straight_from_the_ring_is_taken_or_left() {
    let mut buffer = [0u8; 8];
    let mut incoming = Incoming::keeping_too_long(PEER, send(4), Sink::Slice(&mut buffer));
    // Another kind, or more than one slot: left for the inbox.
    assert!(
        !incoming
            .take_slot(&eager(kind::BARRIER, 0, b"")[0])
            .unwrap()
    );
    assert!(
        !incoming
            .take_slot(&eager(kind::SEND, 4, &[1; 100])[0])
            .unwrap()
    );
    // Too long for the buffer: refused, for the caller to put back.
    let long = eager(kind::SEND, 4, &[1; 9])[0];
    assert!(matches!(
        incoming.take_slot(&long),
        Err(Error::BufferTooSmall { needed: 9, .. })
    ));
    let mut inbox = Inbox::new(PEER);
    inbox.put_back(long);
    assert_eq!(inbox.find(send(4)).unwrap(), Some(0));
    // Out of turn: refused.
    assert!(refusal(incoming.take_slot(&eager(kind::SEND, 5, b"x")[0])).contains("5"));
    assert!(incoming.take_slot(&eager(kind::SEND, 4, b"hi")[0]).unwrap());
    assert!(incoming.is_done());
    assert_eq!(incoming.finish().unwrap().0, 2);
    assert_eq!(&buffer[..2], b"hi");
}

#[test]
fn an_eager_message_straight_from_the_ring_arrives_as_through_the_inbox() {
    let mut region = Region::new(0);
    for len in [INLINE_BYTES + 1, 1000, kind::EAGER_MAX] {
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
        let slots = eager(kind::ALL_GATHER, 7, &data);
        let through_inbox = receive(&mut inbox_with(&slots), gather(7), &mut region).unwrap();
        let mut incoming = Incoming::new(PEER, gather(7), Sink::Vec(Vec::new()));
        assert_eq!(incoming.eager_direct(&slots[0]), Some(slots.len() - 1));
        // The wrong number of continuation slots takes nothing.
        assert!(!incoming.finish_eager(&slots[0], &slots[1..slots.len() - 1]));
        assert!(incoming.at_header());
        assert!(incoming.finish_eager(&slots[0], &slots[1..]));
        assert_eq!(incoming.finish().unwrap().1.into_vec(), through_inbox);
        assert_eq!(through_inbox, data);
    }
}

#[test]
fn only_the_expected_eager_message_that_fits_is_taken_straight_from_the_ring() {
    let data = [9u8; 1000];
    let mut small = [0u8; 100];
    let mut kept = Incoming::keeping_too_long(PEER, send(4), Sink::Slice(&mut small));
    // Too long for a kept buffer, one slot, another receive's, out of turn: the inbox's.
    assert_eq!(kept.eager_direct(&eager(kind::SEND, 4, &data)[0]), None);
    let mut incoming = Incoming::new(PEER, gather(7), Sink::Vec(Vec::new()));
    for header in [
        eager(kind::ALL_GATHER, 7, b"one slot")[0],
        eager(kind::SEND, 7, &data)[0],
        eager(kind::ALL_GATHER, 8, &data)[0],
        eager(kind::BROADCAST, 7, &data)[0],
    ] {
        assert_eq!(incoming.eager_direct(&header), None, "{header:?}");
    }
    // A chunk, an unknown kind, a flagged header or an eager length too long, with the
    // collective's tag: the inbox's too, which names what is wrong, as it does for one slot.
    let mut chunk = eager(kind::ALL_GATHER, 7, &data)[0];
    chunk.kind = kind::CHUNK;
    let mut unknown = chunk;
    unknown.kind = 0x99;
    let mut pipelined = chunk;
    pipelined.kind = kind::ALL_GATHER | kind::PIPELINED;
    let mut too_long = eager(kind::ALL_GATHER, 7, &data)[0];
    too_long.len = kind::EAGER_MAX as u32 + 1;
    assert_eq!(incoming.eager_direct(&too_long), None);
    for header in [chunk, unknown, pipelined] {
        assert_eq!(incoming.eager_direct(&header), None, "{header:?}");
        let mut one = header;
        one.len = 8;
        assert!(!incoming.take_slot(&one).unwrap(), "{one:?}");
    }
    assert!(incoming.at_header());
}

#[test]
fn a_flood_is_refused_once_the_queue_is_full() {
    let mut inbox = Inbox::new(PEER);
    let slot = eager(kind::SEND, 0, b"")[0];
    for _ in 0..MAX_UNREAD {
        inbox.push(slot).unwrap();
    }
    assert!(refusal(inbox.check_room()).contains("nobody receives yet"));
}

#[test]
fn an_absurd_announced_length_is_refused_not_allocated() {
    let mut inline = [0; INLINE_BYTES];
    inline[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut inbox = inbox_with(&[message(kind::SEND | kind::PIPELINED, 0, 0, inline)]);
    let error = refusal(receive_step(&mut inbox));
    assert!(error.contains("could not reserve"), "{error}");
}

fn receive_step(inbox: &mut Inbox) -> Result<bool, Error> {
    let mut incoming = Incoming::new(PEER, send(0), Sink::Vec(Vec::new()));
    inbox.step(&mut incoming, &mut Region::new(0))
}

#[test]
fn a_receive_set_aside_between_chunks_is_resumed_by_the_next_whole() {
    let mut region = Region::new(1000);
    let slots = pipelined(kind::SEND, 0, 1000, 300);
    // Header and two chunks arrive; the receive is interrupted there.
    let mut inbox = inbox_with(&slots[..3]);
    let mut incoming = Incoming::new(PEER, send(0), Sink::Vec(Vec::new()));
    inbox.step(&mut incoming, &mut region).unwrap();
    assert!(incoming.mid_transfer());
    inbox.set_aside(&mut incoming);
    assert!(incoming.at_header());
    // The message is still there, whole, with its whole length.
    let at = inbox.find(send(0)).unwrap().unwrap();
    assert_eq!(message_len(PEER, &inbox.header(at)).unwrap(), 1000);
    // A buffer too small for it is refused, and keeps it.
    let mut small = vec![0u8; 999];
    let mut kept = Incoming::keeping_too_long(PEER, send(0), Sink::Slice(&mut small));
    assert!(matches!(
        inbox.step(&mut kept, &mut region),
        Err(Error::BufferTooSmall { needed: 1000, .. })
    ));
    // The rest arrives; a receive into a buffer gets it all, once.
    for &slot in &slots[3..] {
        inbox.push(slot).unwrap();
    }
    let mut buffer = vec![0u8; 1000];
    let mut resumed = Incoming::keeping_too_long(PEER, send(0), Sink::Slice(&mut buffer));
    inbox.step(&mut resumed, &mut region).unwrap();
    assert_eq!(resumed.finish().unwrap().0, 1000);
    assert_eq!(buffer, region.bytes);
    assert_eq!(region.acks.len(), 4, "each chunk acknowledged once");
    assert!(inbox.is_empty());
}

#[test]
fn a_set_aside_receive_can_be_set_aside_again() {
    let mut region = Region::new(900);
    let slots = pipelined(kind::ALL_GATHER, 4, 900, 300);
    let mut inbox = Inbox::new(PEER);
    for &slot in &slots {
        inbox.push(slot).unwrap();
        let mut incoming = Incoming::new(PEER, gather(4), Sink::Vec(Vec::new()));
        inbox.step(&mut incoming, &mut region).unwrap();
        if incoming.is_done() {
            assert_eq!(incoming.finish().unwrap().1.into_vec(), region.bytes);
            assert!(inbox.is_empty());
            return;
        }
        inbox.set_aside(&mut incoming);
    }
    panic!("the message never completed");
}

#[test]
fn a_resumption_header_cannot_come_from_the_wire() {
    let mut header = pipelined(kind::SEND, 0, 10, 10)[0];
    header.kind |= RESUMED;
    assert!(refusal(Inbox::new(PEER).push(header)).contains("unknown message kind"));
}

#[test]
fn setting_aside_a_receive_that_has_not_started_does_nothing() {
    let mut inbox = inbox_with(&eager(kind::SEND, 0, b"x"));
    let mut incoming = Incoming::new(PEER, send(0), Sink::Vec(Vec::new()));
    inbox.set_aside(&mut incoming);
    assert_eq!(
        receive(&mut inbox, send(0), &mut Region::new(0)).unwrap(),
        b"x"
    );
}

/// The tag of collective number `seq` of `stream`.
fn on_stream(stream: u32, seq: u64) -> u64 {
    (u64::from(stream) << SEQ_BITS) | seq
}

#[test]
fn closing_a_stream_drops_a_message_cut_off_between_its_chunks_and_the_rest_as_it_comes() {
    let mut region = Region::new(1000);
    let world = pipelined(kind::ALL_GATHER, on_stream(0, 1), 1000, 300);
    // Header and one chunk queued when the world's collectives end; the sender gives up there.
    let mut inbox = inbox_with(&world[..2]);
    inbox.close_stream(0);
    assert_eq!(inbox.take_dropped(), vec![reference(0, 300)]);
    assert!(!inbox.is_empty(), "more chunks of it may come");
    // One more chunk came before the sender noticed: dropped (and handed out to acknowledge).
    inbox.push(world[2]).unwrap();
    assert_eq!(inbox.take_dropped(), vec![reference(300, 300)]);
    // The group's message after it is received whole, where the cut-off message used to stand
    // in the way ("cut off ... expected its next chunk").
    let group = pipelined(kind::ALL_GATHER, on_stream(5, 0), 1000, 500);
    for &slot in &group {
        inbox.push(slot).unwrap();
    }
    let got = receive(&mut inbox, gather(on_stream(5, 0)), &mut region).unwrap();
    assert_eq!(got, region.bytes);
    assert!(inbox.is_empty());
}

#[test]
fn closing_a_stream_drops_the_rest_of_a_message_a_receive_was_taking() {
    let mut region = Region::new(1000);
    let world = pipelined(kind::ALL_GATHER, on_stream(0, 3), 1000, 250);
    let mut inbox = inbox_with(&world[..2]);
    let mut incoming = Incoming::new(PEER, gather(on_stream(0, 3)), Sink::Vec(Vec::new()));
    inbox.step(&mut incoming, &mut region).unwrap();
    assert!(incoming.mid_transfer());
    // The collective ends (a member died) with the receive between chunks; it is dropped.
    drop(incoming);
    inbox.push(world[2]).unwrap();
    inbox.close_stream(0);
    inbox.push(world[3]).unwrap();
    assert_eq!(
        inbox.take_dropped(),
        vec![reference(250, 250), reference(500, 250)],
        "the chunks queued and the one that came after"
    );
    // A point-to-point message then arrives whole, and is received.
    let message = eager(kind::SEND, 0, b"after");
    for &slot in &message {
        inbox.push(slot).unwrap();
    }
    assert_eq!(receive(&mut inbox, send(0), &mut region).unwrap(), b"after");
}

#[test]
fn closing_a_stream_leaves_a_point_to_point_message_a_receive_is_taking() {
    // A world collective's messages queued before and after it, and one of its chunks queued:
    // closing the world's stream drops the collective's (moving the message's chunks up the
    // queue), and the receive goes on with the rest of it, whole and in order.
    let mut region = Region::new(900);
    let mut slots = Vec::new();
    slots.extend(pipelined(kind::ALL_GATHER, on_stream(0, 2), 300, 300));
    slots.extend(eager(kind::BARRIER, on_stream(0, 3), &[]));
    let message = pipelined(kind::SEND, 5, 900, 300);
    slots.extend(&message[..2]);
    let mut inbox = inbox_with(&slots);
    let mut incoming = Incoming::new(PEER, send(5), Sink::Vec(Vec::new()));
    inbox.step(&mut incoming, &mut region).unwrap();
    assert!(incoming.mid_transfer());
    inbox.push(message[2]).unwrap();
    inbox.close_stream(0);
    assert_eq!(
        inbox.take_dropped(),
        vec![reference(0, 300)],
        "the collective's chunk"
    );
    inbox.push(message[3]).unwrap();
    inbox.step(&mut incoming, &mut region).unwrap();
    assert!(incoming.is_done());
    let (len, sink) = incoming.finish().unwrap();
    assert_eq!(len, 900);
    assert_eq!(sink.into_vec(), region.bytes);
    assert!(inbox.is_empty());
}

#[test]
fn closing_a_stream_keeps_other_streams_and_point_to_point_messages_in_order() {
    let mut region = Region::new(600);
    let mut slots = Vec::new();
    slots.extend(eager(kind::SEND, 0, b"first"));
    slots.extend(pipelined(kind::ALL_GATHER, on_stream(0, 2), 600, 200));
    slots.extend(eager(kind::BARRIER, on_stream(0, 3), &[]));
    slots.push(with_ref(
        kind::ALL_REDUCE | kind::LOAN,
        on_stream(0, 4),
        reference(0, 64),
    ));
    slots.extend(pipelined(kind::ALL_GATHER, on_stream(7, 0), 600, 300));
    slots.extend(eager(kind::SEND, 1, b"second"));
    let mut inbox = inbox_with(&slots);
    inbox.close_stream(0);
    // The world's pipelined and lent messages go, their blocks to acknowledge; its whole eager
    // ones hold no block and go too.
    assert_eq!(inbox.take_dropped().len(), 4);
    assert!(inbox.find(gather(on_stream(0, 3))).unwrap().is_none());
    assert_eq!(receive(&mut inbox, send(0), &mut region).unwrap(), b"first");
    let group = receive(&mut inbox, gather(on_stream(7, 0)), &mut region).unwrap();
    assert_eq!(group, region.bytes);
    assert_eq!(
        receive(&mut inbox, send(1), &mut region).unwrap(),
        b"second"
    );
    assert!(inbox.is_empty());
    // A world message that comes later is dropped on arrival, chunks and all.
    for &slot in &pipelined(kind::BROADCAST, on_stream(0, 5), 600, 300) {
        inbox.push(slot).unwrap();
    }
    assert_eq!(inbox.take_dropped().len(), 2);
    // Until a header comes, the inbox is not empty (its next slot may be one of those chunks).
    assert!(!inbox.is_empty());
}

#[test]
fn a_headless_chunk_is_still_refused_on_a_stream_nobody_closed() {
    // Closing is what the session does when a member departs; without it a chunk nobody
    // announced is what it always was.
    let inbox = inbox_with(&pipelined(kind::ALL_GATHER, on_stream(2, 0), 600, 300)[1..]);
    assert!(
        refusal(inbox.find(gather(on_stream(2, 0)))).contains("no pipelined message announced")
    );
}

#[test]
fn an_abandoned_receive_leaves_no_chunk_where_a_header_belongs() {
    // A group collective's receive fails between chunks (its call timed out, or a departure
    // on another link ended it) while nobody closes the stream: the chunks already queued go,
    // and so do those its sender still delivers, up to the sender's next header.
    let mut region = Region::new(1000);
    let group = pipelined(kind::ALL_GATHER, on_stream(4, 9), 1000, 200);
    let mut inbox = inbox_with(&group[..3]);
    let mut incoming = Incoming::new(PEER, gather(on_stream(4, 9)), Sink::Vec(Vec::new()));
    // Header and two chunks taken; then two more arrive before the call gives up.
    inbox.step(&mut incoming, &mut region).unwrap();
    assert!(incoming.mid_transfer());
    inbox.push(group[3]).unwrap();
    inbox.push(group[4]).unwrap();
    inbox.abandon(&mut incoming);
    assert!(incoming.at_header());
    assert_eq!(
        inbox.take_dropped(),
        vec![reference(400, 200), reference(600, 200)]
    );
    assert!(!inbox.is_empty(), "its last chunk may still come");
    inbox.push(group[5]).unwrap();
    assert_eq!(inbox.take_dropped(), vec![reference(800, 200)]);
    // The peer's next message is received; before, it failed as "a chunk (tag ...) that no
    // pipelined message announced".
    for &slot in &eager(kind::SEND, 0, b"next") {
        inbox.push(slot).unwrap();
    }
    assert_eq!(receive(&mut inbox, send(0), &mut region).unwrap(), b"next");
    assert!(inbox.is_empty());
    // Abandoning it again, or a receive that never started, does nothing.
    inbox.abandon(&mut incoming);
    inbox.abandon(&mut Incoming::new(PEER, gather(1), Sink::Vec(Vec::new())));
    assert!(inbox.is_empty() && !inbox.has_dropped());
}

#[test]
fn an_abandoned_receive_keeps_what_came_before_and_after_its_message() {
    let mut region = Region::new(600);
    let mut slots = eager(kind::SEND, 0, b"before");
    slots.extend(pipelined(kind::ALL_GATHER, on_stream(2, 1), 600, 200));
    let mut inbox = inbox_with(&slots[..3]);
    let mut incoming = Incoming::new(PEER, gather(on_stream(2, 1)), Sink::Vec(Vec::new()));
    inbox.step(&mut incoming, &mut region).unwrap();
    assert!(incoming.mid_transfer());
    // One more chunk, then the sender gives up on it and sends the next message.
    inbox.push(slots[3]).unwrap();
    for &slot in &eager(kind::SEND, 1, b"after") {
        inbox.push(slot).unwrap();
    }
    inbox.abandon(&mut incoming);
    assert_eq!(inbox.take_dropped(), vec![reference(200, 200)]);
    assert_eq!(
        receive(&mut inbox, send(0), &mut region).unwrap(),
        b"before"
    );
    assert_eq!(receive(&mut inbox, send(1), &mut region).unwrap(), b"after");
    assert!(inbox.is_empty(), "nothing is owed: a header came after it");
}

#[test]
fn abandoning_a_receive_whose_stream_was_closed_does_nothing_more() {
    let mut region = Region::new(1000);
    let world = pipelined(kind::ALL_GATHER, on_stream(0, 3), 1000, 250);
    let mut inbox = inbox_with(&world[..2]);
    let mut incoming = Incoming::new(PEER, gather(on_stream(0, 3)), Sink::Vec(Vec::new()));
    inbox.step(&mut incoming, &mut region).unwrap();
    inbox.push(world[2]).unwrap();
    inbox.close_stream(0);
    assert_eq!(inbox.take_dropped(), vec![reference(250, 250)]);
    inbox.abandon(&mut incoming);
    assert!(!inbox.has_dropped());
    inbox.push(world[3]).unwrap();
    assert_eq!(inbox.take_dropped(), vec![reference(500, 250)]);
}

#[test]
fn closing_the_stream_of_a_receive_that_skipped_a_message_drops_the_rest_as_it_comes() {
    // The chaos soak's failure: an eager message of a stream closed long ago sits unreceived
    // ahead of a group's pipelined message, which a receive is taking (so its chunks are not at
    // the front). The group's collective fails on a death and its stream closes: the chunks of
    // the taken message still to come are dropped as they come. Before, the older message ahead
    // of them made the close think its sender had given up on it, the later chunks were
    // queued, and the next receive failed: "a chunk ... that no pipelined message announced".
    let mut region = Region::new(1000);
    let mut inbox = Inbox::new(PEER);
    inbox.close_stream(1);
    let mut slots = eager(kind::BARRIER, on_stream(1, 5), b"late");
    let group = pipelined(kind::BROADCAST, on_stream(2, 402), 1000, 250);
    slots.extend(&group[..3]);
    for &slot in &slots {
        inbox.push(slot).unwrap();
    }
    let mut incoming = Incoming::new(
        PEER,
        Expect::Collective {
            op: kind::BROADCAST,
            seq: on_stream(2, 402),
        },
        Sink::Vec(Vec::new()),
    );
    inbox.step(&mut incoming, &mut region).unwrap();
    assert!(incoming.mid_transfer());
    inbox.close_stream(2);
    inbox.abandon(&mut incoming);
    inbox.push(group[3]).unwrap();
    inbox.push(group[4]).unwrap();
    assert_eq!(
        inbox.take_dropped(),
        vec![reference(500, 250), reference(750, 250)]
    );
    for &slot in &eager(kind::SEND, 0, b"next") {
        inbox.push(slot).unwrap();
    }
    assert_eq!(receive(&mut inbox, send(0), &mut region).unwrap(), b"next");
}
