//! Helpers shared by the multi-process test binaries.

#![allow(dead_code)] // each test binary uses its own subset

use shmbroker::handshake::{Config, Listener, StopHandle};
use shmbroker::process::ChildGuard;
use shmbroker::session::Session;
use std::io::Read;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long any child of a test may run before it is killed and the test fails.
pub const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// `$TMPDIR/shmbroker-<name>-<pid>`, created fresh and removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shmbroker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How long a session of an in-process [`World`] waits for a peer before it fails the test.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// A broker on a thread of this process; dropping it stops the broker and removes its folder.
pub struct World {
    stop: StopHandle,
    broker: Option<JoinHandle<()>>,
    // Declared last: dropped after `drop` below has stopped the broker.
    _dir: TempDir,
}

impl World {
    /// A broker for `size` ranks and one session per rank, each logged on from its own thread,
    /// with [`SESSION_TIMEOUT`] as every session's deadline.
    pub fn start(name: &str, size: u32) -> (Self, Vec<Session>) {
        let dir = TempDir::new(&format!("world-{name}"));
        let path = dir.0.join("broker.sock");
        let config = Config {
            world_size: size,
            ring_capacity: 64,
            ..Config::default()
        };
        let mut listener = Listener::bind(&path, config).unwrap();
        let stop = listener.stop_handle();
        let broker = std::thread::spawn(move || listener.serve(|_| {}).unwrap());
        let joins: Vec<_> = (0..size)
            .map(|rank| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut session = Session::connect(&path, Some(rank), SESSION_TIMEOUT).unwrap();
                    session.set_timeout(SESSION_TIMEOUT);
                    session
                })
            })
            .collect();
        let sessions = joins.into_iter().map(|j| j.join().unwrap()).collect();
        let world = Self {
            stop,
            broker: Some(broker),
            _dir: dir,
        };
        (world, sessions)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(broker) = self.broker.take() {
            let _ = broker.join();
        }
    }
}

/// Waits for `child` (failing the test if it outlives [`CHILD_DEADLINE`]; the guard then kills
/// it) and returns (success, stdout, stderr). The pipes are read after the exit: a read would
/// block on a hung child, the wait does not (outputs here are far below a pipe's buffer).
pub fn finish(mut child: ChildGuard) -> (bool, String, String) {
    let status = child
        .wait_timeout(CHILD_DEADLINE)
        .unwrap()
        .expect("a child was still running at its deadline");
    let mut stdout = String::new();
    if let Some(pipe) = child.stdout() {
        let _ = pipe.read_to_string(&mut stdout);
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.take_stderr() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    (status.success(), stdout, stderr)
}
