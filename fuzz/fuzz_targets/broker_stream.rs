//! A fresh broker fed an arbitrary byte stream on a socketpair, as a worker would send it: the
//! broker answers (accepts or refuses) and keeps no connection pending; whatever it answers
//! decodes on the worker's side without a panic. Nothing here blocks: the stream is closed after
//! the bytes, so a short frame is refused as truncated at once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker_handshake::wire::decode_reply_header;
use shmbroker_handshake::{Config, Listener};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static RUN: AtomicU64 = AtomicU64::new(0);

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("shmbroker-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{}.sock", RUN.fetch_add(1, Ordering::Relaxed)));
    let config = Config {
        world_size: 2,
        ring_capacity: 2,
        ..Config::default()
    };
    let mut listener = Listener::bind(&path, config).expect("bind");
    let (broker_end, mut worker_end) = UnixStream::pair().expect("socketpair");
    // Large inputs would fill the socket buffer; the broker reads only a frame's worth anyway.
    let _ = worker_end.set_nonblocking(true);
    let _ = worker_end.write(data);
    let _ = worker_end.shutdown(std::net::Shutdown::Write);
    listener.adopt(broker_end);
    for _ in 0..100 {
        if listener.pending_logons() == 0 {
            break;
        }
        listener.poll_once(Duration::ZERO).expect("poll");
    }
    assert_eq!(
        listener.pending_logons(),
        0,
        "a connection was left pending"
    );
    let _ = worker_end.set_nonblocking(true);
    let mut reply = Vec::new();
    let _ = worker_end.read_to_end(&mut reply);
    let _ = decode_reply_header(&reply);
    drop(listener); // removes its socket file
    let _ = std::fs::remove_dir(&dir);
});
