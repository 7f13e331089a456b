//! Moving fds leaves no fd behind: hundreds of fd exchanges, fd broadcasts and GPU-handle
//! gathers between two in-process ranks, over both transports, and the process's fd count is
//! where it started. Alone in its own test binary, so that no concurrent test moves the count.

use shmbroker::bindings::{GPU_HANDLE_BYTES, GpuHandle, GpuHandleKind};
use shmbroker::session::{FdTransport, Session};
use std::os::fd::AsFd;

mod common;

use common::World;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rounds(session: &mut Session, count: usize) {
    let mine = shmbroker::queues::memfd::create_sealed(c"leak-test", 4096).unwrap();
    let handle = GpuHandle {
        kind: GpuHandleKind::HostMemfd as u32,
        flags: 0,
        device_uuid: [0; 16],
        handle: [0; GPU_HANDLE_BYTES],
        size: 4096,
        offset: 0,
        buffer_id: 0,
    };
    for i in 0..count {
        drop(session.exchange_fds(mine.as_fd()).unwrap());
        let root = (i % 2) as u32;
        let offered = (session.rank() == root).then(|| mine.as_fd());
        drop(session.broadcast_fd(root, offered).unwrap());
        drop(
            session
                .all_gather_gpu_handles(&handle, Some(mine.as_fd()))
                .unwrap(),
        );
    }
}

#[test]
fn moving_fds_leaves_no_fd_behind() {
    let (world, sessions) = World::start("fd-leak", 2);
    let [mut zero, mut one]: [Session; 2] = sessions.try_into().unwrap();

    for transport in [FdTransport::Auto, FdTransport::Relay] {
        zero.set_fd_transport(transport);
        one.set_fd_transport(transport);
        // Warm up: sessions keep a pidfd per exporter process.
        let peer = std::thread::spawn(move || {
            rounds(&mut one, 2);
            one
        });
        rounds(&mut zero, 2);
        one = peer.join().unwrap();
        let before = open_fds();
        let peer = std::thread::spawn(move || {
            rounds(&mut one, 200);
            one
        });
        rounds(&mut zero, 200);
        one = peer.join().unwrap();
        assert_eq!(open_fds(), before, "fds leaked moving fds by {transport:?}");
    }
    drop((zero, one, world));
}
