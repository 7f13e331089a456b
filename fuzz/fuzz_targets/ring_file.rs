//! A peer hands over a sealed memfd holding arbitrary bytes and calls it a ring.
//!
//! Joining must either fail with an error or yield endpoints whose every operation returns
//! normally: no panic, no out-of-bounds access, no hang (every call here is non-blocking).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker_queues::memfd::create_sealed;
use shmbroker_queues::{Consumer, Producer};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

fuzz_target!(|data: &[u8]| {
    let Ok(fd) = create_sealed(c"fuzz-ring", data.len() as u64) else {
        return;
    };
    let Ok(copy) = fd.try_clone() else { return };
    if File::from(copy).write_all_at(data, 0).is_err() {
        return;
    }
    let rx = Consumer::<[u64; 2]>::join(fd.as_fd());
    let tx = Producer::<[u64; 2]>::join(fd.as_fd());
    if let (Ok(mut rx), Ok(mut tx)) = (rx, tx) {
        let mut buffer = [[0u64; 2]; 3];
        for round in 0..4u64 {
            let _ = rx.try_recv();
            let _ = tx.try_send([round, !round]);
            let _ = rx.try_recv_batch(&mut buffer);
            let _ = tx.try_send_batch(&[[round, round]; 5]);
        }
    }
});
