//! Helpers shared by the multi-process test binaries.

#![allow(dead_code)] // each test binary uses its own subset

use shmbroker::Collectives;
use shmbroker::handshake::{Config, Event, Listener, StopHandle};
use shmbroker::session::Session;
use shmbroker_test_support::process::{ChildGuard, spawn_with_fds};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The `shmbroker` command: `shmbroker_cli::main`, the shipped binary's one line, built by this
/// crate as `shmbroker-under-test` (Cargo gives a test the path of its own package's binaries
/// only).
pub const SHMBROKER: &str = env!("CARGO_BIN_EXE_shmbroker-under-test");

/// How long any child of a test may run before it is killed and the test fails.
pub const CHILD_DEADLINE: Duration = Duration::from_secs(120);

pub use shmbroker_test_support::TempDir;

/// A copy of the `shmbroker` binary in `dir`, with `dir` opened to everyone (mode 0755), for
/// children that run as another uid: the build's own target directory may lie where that uid
/// cannot reach (a clone under `/root`, inside a `mktemp -d` directory), and a test must set up
/// everything it runs.
pub fn binary_for_any_uid(dir: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let open = |path: &std::path::Path| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    open(dir);
    let copy = dir.join("shmbroker");
    // A hard link where it can be (same file system, and no copy that another thread's fork
    // could still hold open for writing when this one execs it: ETXTBSY); a copy where not.
    if std::fs::hard_link(SHMBROKER, &copy).is_err() {
        std::fs::copy(SHMBROKER, &copy).unwrap();
        open(&copy);
    }
    copy
}

/// `spawn_with_fds` with no fds, retried while the binary is busy (`ETXTBSY`: a copy just written
/// may still be open for writing in a child another thread forked meanwhile, until it execs).
pub fn spawn(command: &mut Command) -> ChildGuard {
    let mut tries = 0;
    loop {
        match spawn_with_fds(command, &[]) {
            Err(error) if error.raw_os_error() == Some(nix::libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            spawned => return spawned.unwrap(),
        }
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
        Self::start_with_outbox(name, size, shmbroker::session::DEFAULT_OUTBOX_BYTES)
    }

    /// [`Self::start`] with outboxes of `outbox_bytes`.
    pub fn start_with_outbox(name: &str, size: u32, outbox_bytes: u64) -> (Self, Vec<Session>) {
        let dir = TempDir::new(&format!("world-{name}")).unwrap();
        let path = dir.join("broker.sock");
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
                    let mut session = Session::connect_with_outbox(
                        &path,
                        Some(rank),
                        SESSION_TIMEOUT,
                        outbox_bytes,
                    )
                    .unwrap();
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
pub fn finish(child: ChildGuard) -> (bool, String, String) {
    let (status, stdout, stderr) = finish_status(child);
    (status.success(), stdout, stderr)
}

/// Like [`finish`], with the exit status itself (to tell an exit from a signal).
pub fn finish_status(mut child: ChildGuard) -> (std::process::ExitStatus, String, String) {
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
    (status, stdout, stderr)
}

/// Runs `world` copies of this test binary, each the ignored test `rank_test` with scenario
/// `scenario` and variables `env` (its rank, the broker's socket and the scenario in
/// `SHMBROKER_TEST_RANK`, `SHMBROKER_TEST_SOCKET` and `SHMBROKER_TEST_SCENARIO`), under a broker
/// named `name`; returns each rank's (success, stderr), waiting for each with a deadline.
pub fn run_ranks(
    rank_test: &str,
    name: &str,
    world: u32,
    scenario: &str,
    env: &[(&str, &str)],
) -> Vec<(bool, String)> {
    let broker = Broker::start(name, world);
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args(["--ignored", "--exact", rank_test, "--nocapture"])
                .env("SHMBROKER_TEST_SCENARIO", scenario)
                .env("SHMBROKER_TEST_SOCKET", broker.socket())
                .env("SHMBROKER_TEST_RANK", rank.to_string())
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            spawn(&mut command)
        })
        .collect();
    ranks
        .into_iter()
        .map(|child| {
            let (ok, _, stderr) = finish(child);
            (ok, stderr)
        })
        .collect()
}

/// In a rank [`run_ranks`] started: its scenario and a session logged on as its rank (60 s to
/// log on); `None` when this test was run directly (it is then nothing to do).
pub fn rank_session() -> Option<(String, Session)> {
    let scenario = std::env::var("SHMBROKER_TEST_SCENARIO").ok()?;
    let socket = std::env::var("SHMBROKER_TEST_SOCKET").ok()?;
    let rank: u32 = std::env::var("SHMBROKER_TEST_RANK").ok()?.parse().unwrap();
    let session = Session::connect(&socket, Some(rank), Duration::from_secs(60)).unwrap();
    Some((scenario, session))
}

/// A broker on a thread, for a world of `world` ranks, in a temp dir; stopped on drop.
pub struct Broker {
    pub dir: PathBuf,
    /// The binary workers run: the build's own, or [`binary_for_any_uid`]'s copy.
    pub program: PathBuf,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
    events: mpsc::Receiver<Event>,
}

impl Broker {
    pub fn start(name: &str, world: u32) -> Self {
        Self::start_with(name, world, Vec::new())
    }

    pub fn start_with(name: &str, world: u32, allowed_uids: Vec<u32>) -> Self {
        let dir = std::env::temp_dir().join(format!("shmbroker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = Config {
            world_size: world,
            ring_capacity: 256,
            allowed_uids,
            ..Config::default()
        };
        let mut listener = Listener::bind(dir.join("broker.sock"), config).unwrap();
        let stop = listener.stop_handle();
        let (tx, events) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            listener
                .serve(|event| {
                    let _ = tx.send(event.clone());
                })
                .unwrap();
        });
        Self {
            dir,
            program: SHMBROKER.into(),
            stop,
            thread: Some(thread),
            events,
        }
    }

    pub fn socket(&self) -> String {
        self.dir.join("broker.sock").to_str().unwrap().to_owned()
    }

    pub fn worker(&self, rank: u32, extra: &[&str]) -> ChildGuard {
        self.worker_with(rank, extra, |_| {})
    }

    pub fn worker_with(
        &self,
        rank: u32,
        extra: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> ChildGuard {
        let mut command = Command::new(&self.program);
        command
            .args([
                "worker",
                "--socket",
                &self.socket(),
                "--rank",
                &rank.to_string(),
            ])
            .args(["--selftest", "--timeout-ms", "60000"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        adjust(&mut command);
        spawn(&mut command)
    }

    /// Waits until `count` workers have logged on.
    pub fn await_logons(&self, count: usize) {
        let mut seen = 0;
        while seen < count {
            if let Event::LoggedOn { .. } = self.events.recv_timeout(CHILD_DEADLINE).unwrap() {
                seen += 1;
            }
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The next line `reader` gives, waiting at most `timeout` (the test fails past it): a child that
/// never says what it should must not hang the test.
pub fn read_line_within(reader: impl std::io::Read + Send + 'static, timeout: Duration) -> String {
    use std::io::BufRead;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(reader).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(timeout)
        .unwrap_or_else(|_| panic!("no line within {timeout:?}"))
}

/// `shmbroker ARGS...` (the build's binary) with its output piped.
pub fn shmbroker(args: &[&str]) -> Command {
    let mut command = Command::new(SHMBROKER);
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `hostile ARGS...` (the test helper) with its output piped.
pub fn hostile(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hostile"));
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `shmbroker serve --socket SOCKET ARGS...`, once its socket file exists (with a deadline).
pub fn serve(socket: &std::path::Path, args: &[&str]) -> ChildGuard {
    let mut command = shmbroker(&["serve", "--socket", socket.to_str().unwrap()]);
    command.args(args);
    let child = spawn(&mut command);
    let deadline = std::time::Instant::now() + CHILD_DEADLINE;
    while !socket.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the broker never created its socket"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

/// A broker for `config` on a thread of this process, listening on `socket`: its stop handle
/// and thread (stop, then join it, at the end of the test).
pub fn listen_on_thread(
    socket: &std::path::Path,
    config: Config,
) -> (
    StopHandle,
    JoinHandle<Result<(), shmbroker::handshake::Error>>,
) {
    let mut listener = Listener::bind(socket, config).unwrap();
    let stop = listener.stop_handle();
    (stop, std::thread::spawn(move || listener.serve(|_| {})))
}

/// A small world's config: rings of 64 slots.
pub fn small_world(world_size: u32) -> Config {
    Config {
        world_size,
        ring_capacity: 64,
        ..Config::default()
    }
}

/// FNV-1a, as `farm-worker` answers with.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Task `id` of `len` bytes: its id, then bytes that depend on it.
pub fn task(id: u64, len: usize) -> Vec<u8> {
    let mut bytes = id.to_le_bytes().to_vec();
    bytes.extend((8..len.max(8)).map(|i| (i as u64 ^ id.wrapping_mul(31)) as u8));
    bytes
}

/// `farm-worker` for `rank`, with its extra arguments.
pub fn farm_worker(broker: &Broker, rank: u32, extra: &[&str]) -> ChildGuard {
    farm_worker_with(broker, rank, extra, Stdio::null())
}

pub fn farm_worker_with(broker: &Broker, rank: u32, extra: &[&str], stdout: Stdio) -> ChildGuard {
    let mut command = Command::new(env!("CARGO_BIN_EXE_farm-worker"));
    command
        .args(["--socket", &broker.socket()])
        .args(["--rank", &rank.to_string(), "--timeout-ms", "60000"])
        .args(extra)
        .stdout(stdout)
        .stderr(Stdio::piped());
    spawn(&mut command)
}

/// A barrier right before `dying` (ranks that kill themselves once it returns) die: a rank of
/// `dying` may return from it, and die, while a slower survivor is still waiting for a live
/// rank's arrival, and that survivor's barrier then rightly fails naming the death (a
/// collective that races a death may end differently at different ranks, as in ULFM). Either
/// outcome is taken; any other error panics.
pub fn barrier_before_deaths(session: &mut Session, dying: &[u32]) {
    match session.barrier() {
        Ok(()) => {}
        Err(shmbroker::session::Error::PeerLost { rank, .. }) if dying.contains(&rank) => {}
        Err(error) => panic!("rank {}: barrier: {error}", session.rank()),
    }
}

/// A memfd holding `text` at offset 0.
pub fn memfd_with(text: &str) -> std::os::fd::OwnedFd {
    use std::os::unix::fs::FileExt;
    let fd = shmbroker::queues::memfd::create_sealed(c"fd-exchange-test", 4096).unwrap();
    let file = std::fs::File::from(fd.try_clone().unwrap());
    file.write_all_at(text.as_bytes(), 0).unwrap();
    fd
}

/// The text at offset 0 of the file `fd` opens (up to 64 bytes, up to the first NUL).
pub fn text_of(fd: &std::os::fd::OwnedFd) -> String {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::from(fd.try_clone().unwrap());
    let mut bytes = [0u8; 64];
    file.read_at(&mut bytes, 0).unwrap();
    String::from_utf8_lossy(&bytes)
        .trim_end_matches('\0')
        .to_owned()
}

// The session suite's (session*.rs) own: a pair of ranks and the bytes only a forger sends.

/// A deadline long enough for anything in these tests.
pub const SESSION: Duration = Duration::from_secs(30);

/// `outcome` must be [`Error::Protocol`] from rank `from`, saying `text`.
pub fn expect_protocol<T: std::fmt::Debug>(
    outcome: Result<T, shmbroker::session::Error>,
    from: u32,
    text: &str,
) {
    match outcome {
        Err(shmbroker::session::Error::Protocol { peer, detail }) => {
            assert_eq!(peer, from, "{detail}");
            assert!(detail.contains(text), "{detail}");
        }
        other => panic!("expected a protocol error from rank {from} saying {text:?}: {other:?}"),
    }
}

/// A fresh world of two ranks: its broker (keep it alive) and sessions 0 and 1.
pub fn pair(name: &str) -> (World, shmbroker::Session, shmbroker::Session) {
    let (world, sessions) = World::start(name, 2);
    let mut sessions = sessions.into_iter();
    (world, sessions.next().unwrap(), sessions.next().unwrap())
}

/// Sends `message` straight on `session`'s ring to rank 0, as only a forger would.
pub fn raw_send(session: &mut shmbroker::Session, message: shmbroker::bindings::Message) {
    session
        .raw()
        .link(0)
        .unwrap()
        .to
        .send_timeout(message, Duration::from_secs(5))
        .unwrap();
}

/// A ring message of `kind`, `tag`, `len` and `inline` bytes, whatever they say.
pub fn raw(
    kind: u32,
    tag: u64,
    len: u32,
    inline: [u8; shmbroker::bindings::INLINE_BYTES],
) -> shmbroker::bindings::Message {
    shmbroker::bindings::Message {
        kind,
        len,
        tag,
        inline,
    }
}
