//! The worker's decoders of the broker's reply header and manifest, fed arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker_handshake::wire::{REPLY_HEADER_LEN, decode_manifest, decode_reply_header};

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = decode_reply_header(data) {
        assert!(header.rank < header.world_size);
        if let Ok(manifest) = decode_manifest(&header, &data[REPLY_HEADER_LEN..]) {
            assert_eq!(manifest.len(), header.fd_count as usize);
        }
    }
});
