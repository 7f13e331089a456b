//! `shmbroker status`'s side: the decoder of a broker's status answer, then the reading of each
//! rank's status words (which that rank wrote, whatever it liked), fed arbitrary bytes: a report
//! or an error, and text with no byte a rank chose outside an ASCII word, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker::status::{Activity, describe};
use shmbroker_handshake::wire::decode_status_reply;

fuzz_target!(|data: &[u8]| {
    // The status words alone, at any clock reading: as peers read them for a timeout.
    if data.len() >= 8 + 256 {
        let now = u64::from_le_bytes(data[..8].try_into().unwrap());
        let words: shmbroker_allocator::Snapshot = bytemuck::pod_read_unaligned(&data[8..8 + 256]);
        let text = describe(3, &words, now);
        assert!(
            text.bytes().all(|b| b.is_ascii_graphic() || b == b' '),
            "{text:?}"
        );
        let _ = Activity::read(&words, now);
    }
    if let Ok(report) = decode_status_reply(data) {
        assert_eq!(report.ranks.len(), report.header.world_size as usize);
        for (rank, record) in (0..).zip(&report.ranks) {
            assert_eq!(record.rank, rank);
            let _ = describe(rank, &record.status, shmbroker::status::now());
        }
    }
});
