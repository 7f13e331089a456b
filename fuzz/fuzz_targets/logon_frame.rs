//! The broker's decoder of a worker's logon frame, fed arbitrary bytes: a value or an error with
//! a reason code, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker_handshake::wire::decode_logon;

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = decode_logon(data) {
        // Whatever passed is a frame the broker may act on: its checked fields hold.
        assert_eq!(frame.magic, shmbroker_bindings::LOGON_MAGIC);
        assert_eq!(frame._pad0, 0);
    }
});
