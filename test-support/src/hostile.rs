//! `hostile`: a worker that attacks its peers' shared memory, for the tests that check no peer can
//! hurt another.
//!
//! * `reopen`: takes every peer's outbox fd straight from the broker, adds its own outbox, and
//!   tries every way to write each one: `write`, `pwrite` and a writable shared `mmap` of the fd
//!   and of `/proc/self/fd/N` reopened read-write, `mprotect` of a read-only mapping to writable,
//!   `madvise(MADV_REMOVE)`, hole punching, `ftruncate`. Prints one line per attempt the kernel
//!   allowed and exits 1 if there was any. Then takes part in the session's two barriers, like
//!   `worker --selftest --only barrier --repeat 1`.
//! * `scribble`: takes part in the collectives of `worker --selftest --only sizes` honestly
//!   while, `--delay-ms` in, a second thread starts filling every shared writable mapping of a
//!   shmbroker memfd in this process (its rings' ends and its own outbox) with random bytes, again
//!   and again for `--for-ms`; then the process exits without a goodbye.
//! * `outbox-garbage`: takes part in `--rounds` rounds of [`reductions_round`] honestly, and from
//!   the second round on, a second thread fills its own outbox (and nothing else) with random bytes, pass after pass:
//!   the attack on the reductions, which read contributions straight from their owners'
//!   outboxes. Then stops scribbling, meets its peers at a barrier, prints `hostile: scribbled
//!   over its outbox P times in R rounds` and exits 0.
//! * `relay-flood`: relays `--count` fds to rank `--to` through the broker, which that rank
//!   never takes; prints `delivered D refused R` and the first refusal, then waits to be killed.
//! * `notice-flood`: sends `--count` notices the broker must refuse, as fast as its socket takes
//!   them; prints `sent N`, then waits to be killed.
//! * `status-forge`: publishes an outbox and writes forged status words into it, again and
//!   again until killed: names with terminal escapes and bytes that are no ASCII word, times in
//!   the future, every word `u64::MAX`, random words, torn slots. Prints `forging` once it has
//!   published its outbox.
//! * `gave-up-forge`: publishes an outbox whose status words say the last collective it failed
//!   was the world's barrier #0, naming `--named` (any number), and never takes part in it: the
//!   victims' barrier must fail at once naming this rank, and its word only as a rank of the
//!   world. Prints `forging` once the words are written, then lingers.
//! * `group-forge`: publishes an outbox (process 1 of its rank, as an honest first process
//!   says) and writes one forged proposal for the group of every rank to each peer, as its
//!   first setup message there: ballot 1, every member's first process, and stream `--stream`
//!   (by default the last one below the setup stream), which no honest member proposes. The
//!   victims' `group` must fail naming this rank, and leave group-making to the survivors.
//!   Prints `forged` once the messages are in the rings, then lingers.
//! * `shrink-liar`: publishes an outbox likewise and, as `shrink`'s first coordinator, sends
//!   each peer an estimate saying rank `--departed` departed, as its first setup message there.
//!   Prints `forged`, then lingers: no victim may shrink without that live rank.
//! * `blame-liar`: publishes an outbox likewise and, as the first coordinator of making the
//!   group of every rank, sends each peer an honest proposal (ballot 1, every member's first
//!   process, stream 1) as its first setup message there, then, reading nothing, a decision of
//!   that attempt blaming rank `--blamed` (`--outcome`: it departed, sent a forgery, or passed
//!   other ranks, naming none) as its second. Prints `forged`, then lingers: no victim may blame
//!   that live, honest rank, each must name this one.

use nix::fcntl::{FallocateFlags, OFlag, fallocate, open};
use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap, mprotect, munmap};
use nix::sys::stat::Mode;
use shmbroker::Collectives;
use shmbroker::allocator::Outbox;
use shmbroker::bindings::{ANY_RANK, LogonFrame};
use shmbroker::session::Session;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);

/// `hostile`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The attack.
    #[arg(value_enum)]
    mode: Attack,
    #[arg(long)]
    socket: String,
    #[arg(long)]
    rank: Option<u32>,
    /// scribble: how long after logon the scribbling starts.
    #[arg(long, default_value_t = 100)]
    delay_ms: u64,
    /// scribble: how long it goes on.
    #[arg(long, default_value_t = 500)]
    for_ms: u64,
    /// outbox-garbage: how many rounds of reductions it takes part in.
    #[arg(long, default_value_t = 20)]
    rounds: u64,
    /// relay-flood: the rank the fds go to.
    #[arg(long, default_value_t = 0)]
    to: u32,
    /// relay-flood and notice-flood: how many.
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// gave-up-forge: the rank it says its failed call named (its low 32 bits).
    #[arg(long, default_value_t = 0)]
    named: u64,
    /// group-forge: the stream it proposes.
    #[arg(long, default_value_t = SETUP_STREAM - 1)]
    stream: u32,
    /// shrink-liar: the rank it says departed.
    #[arg(long, default_value_t = 2)]
    departed: u32,
    /// blame-liar: what its decision blames `--blamed` for.
    #[arg(long, value_enum, default_value_t = Blame::Departed)]
    outcome: Blame,
    /// blame-liar: the rank its decision blames.
    #[arg(long, default_value_t = 1)]
    blamed: u32,
}

/// What `blame-liar`'s decision says of the rank it blames: the outcome codes of
/// `agree::Outcome::code`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Blame {
    /// It departed (code 3).
    Departed,
    /// It sent what no honest member sends (code 5).
    Forged,
    /// It passed other ranks (code 4), naming none.
    Mismatch,
}

impl Blame {
    fn code(self) -> u32 {
        match self {
            Self::Departed => 3,
            Self::Mismatch => 4,
            Self::Forged => 5,
        }
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Attack {
    Reopen,
    Scribble,
    OutboxGarbage,
    RelayFlood,
    NoticeFlood,
    StatusForge,
    GaveUpForge,
    GroupForge,
    ShrinkLiar,
    BlameLiar,
}

pub fn run(args: &Args) -> Result<(), String> {
    let (socket, rank) = (args.socket.as_str(), args.rank);
    match args.mode {
        Attack::Reopen => reopen(socket, rank),
        Attack::Scribble => scribble(
            socket,
            rank,
            Duration::from_millis(args.delay_ms),
            Duration::from_millis(args.for_ms),
        ),
        Attack::OutboxGarbage => outbox_garbage(socket, rank, args.rounds),
        Attack::RelayFlood => relay_flood(socket, rank, args.to, args.count),
        Attack::NoticeFlood => notice_flood(socket, rank, args.count),
        Attack::StatusForge => status_forge(socket, rank),
        Attack::GaveUpForge => gave_up_forge(socket, rank, args.named),
        Attack::GroupForge => group_forge(socket, rank, args.stream),
        Attack::ShrinkLiar => shrink_liar(socket, rank, args.departed),
        Attack::BlameLiar => blame_liar(socket, rank, args.outcome, args.blamed),
    }
}

fn log_on(socket: &str, rank: Option<u32>) -> Result<shmbroker::handshake::Connection, String> {
    shmbroker::handshake::connect(socket, LogonFrame::new(rank.unwrap_or(ANY_RANK)), TIMEOUT)
        .map_err(|e| e.to_string())
}

/// Waits to be killed, so that what the attack left (fds in the victim, lines in the log) is
/// still there when the test looks.
fn linger() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn relay_flood(socket: &str, rank: Option<u32>, to: u32, count: u64) -> Result<(), String> {
    let mut raw = log_on(socket, rank)?;
    let file = shmbroker::queues::memfd::create_sealed(c"shmbroker-flood", 4096)
        .map_err(|e| e.to_string())?;
    let (mut delivered, mut refused, mut first) = (0u64, 0u64, None);
    for token in 0..count {
        match raw.relay_fd(to, token, file.as_fd(), TIMEOUT) {
            Ok(()) => delivered += 1,
            Err(error) => {
                refused += 1;
                first.get_or_insert(error.to_string());
            }
        }
    }
    println!(
        "delivered {delivered} refused {refused}: {}",
        first.unwrap_or_default()
    );
    std::io::Write::flush(&mut std::io::stdout()).map_err(|e| e.to_string())?;
    linger()
}

fn notice_flood(socket: &str, rank: Option<u32>, count: u64) -> Result<(), String> {
    let raw = log_on(socket, rank)?;
    let junk = vec![0xABu8; 24 * 64];
    let total = count * 24;
    let mut sent = 0u64;
    let mut stream = raw.broker_socket();
    while sent < total {
        let left = (total - sent).min(junk.len() as u64) as usize;
        match std::io::Write::write(&mut stream, &junk[..left]) {
            Ok(n) => sent += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => return Err(format!("after {} notices: {e}", sent / 24)),
        }
    }
    println!("sent {}", sent / 24);
    std::io::Write::flush(&mut std::io::stdout()).map_err(|e| e.to_string())?;
    linger()
}

fn gave_up_forge(socket: &str, rank: Option<u32>, named: u64) -> Result<(), String> {
    use shmbroker::bindings::{kind, status_word as w};
    use std::sync::atomic::Ordering::Relaxed;
    let mut raw = log_on(socket, rank)?;
    let own = Outbox::create(raw.rank(), 1 << 20).map_err(|e| e.to_string())?;
    let words = own.status();
    let slot = words.slot(0);
    for (at, value) in [
        (w::LAST_CALL, u64::from_le_bytes(*b"barrier\0")),
        (w::LAST_CALL + 1, 0),
        (w::LAST_SEQ, 0),
        // The world's stream (0), as a collective publishes it.
        (w::LAST_GROUP_PEER, u64::from(u32::MAX) << 32),
        (w::LAST_KIND, u64::from(kind::BARRIER)),
        (
            w::FAILED_STREAM_NAMED,
            w::FAILED_RECORD | named & u64::from(u32::MAX),
        ),
        (w::FAILED_SEQ, 0),
    ] {
        slot[at].store(value, Relaxed);
    }
    raw.publish_outbox(own.fd(), TIMEOUT)
        .map_err(|e| e.to_string())?;
    println!("forging");
    std::io::Write::flush(&mut std::io::stdout()).map_err(|e| e.to_string())?;
    linger()
}

/// The stream that making groups and shrinking use (`session::groups::SETUP_STREAM`): the
/// largest of the tag's top 24 bits.
const SETUP_STREAM: u32 = (1 << 24) - 1;

/// Bits of a tag below its stream (`shmbroker`'s `tag::SEQ_BITS`).
const SEQ_BITS: u32 = 40;

/// The tag of setup message `n` of a pair and direction.
fn setup_tag(n: u64) -> u64 {
    (u64::from(SETUP_STREAM) << SEQ_BITS) | n
}

/// Logs on and publishes an outbox that says this is the job's first process of its rank, as
/// an honest session does: peers making a group wait for that word.
fn log_on_with_outbox(
    socket: &str,
    rank: Option<u32>,
) -> Result<(shmbroker::handshake::Connection, Outbox), String> {
    use shmbroker::bindings::status_word::{ALIVE_SLOT, INCARNATION};
    let mut raw = log_on(socket, rank)?;
    let own = Outbox::create(raw.rank(), 1 << 20).map_err(|e| e.to_string())?;
    // Incarnation 0, plus one.
    own.status().slot(ALIVE_SLOT)[INCARNATION].store(1, std::sync::atomic::Ordering::Release);
    raw.publish_outbox(own.fd(), TIMEOUT)
        .map_err(|e| e.to_string())?;
    Ok((raw, own))
}

/// Writes one eager message of `kind` and `tag` carrying `payload` (inline) to `peer`'s ring;
/// the ring wakes the peer.
fn send_inline(
    raw: &mut shmbroker::handshake::Connection,
    peer: u32,
    kind: u32,
    tag: u64,
    payload: &[u8],
) -> Result<(), String> {
    use shmbroker::bindings::{INLINE_BYTES, Message};
    let mut inline = [0u8; INLINE_BYTES];
    inline
        .get_mut(..payload.len())
        .ok_or_else(|| format!("{} bytes do not fit one slot", payload.len()))?
        .copy_from_slice(payload);
    let message = Message {
        kind,
        len: payload.len() as u32,
        tag,
        inline,
    };
    let link = raw
        .link(peer)
        .ok_or_else(|| format!("no link to rank {peer}"))?;
    link.to
        .try_send(message)
        .map_err(|e| format!("to rank {peer}: {e}"))
}

/// Prints `forged` and waits to be killed.
fn forged() -> Result<(), String> {
    println!("forged");
    std::io::Write::flush(&mut std::io::stdout()).map_err(|e| e.to_string())?;
    linger()
}

fn group_forge(socket: &str, rank: Option<u32>, stream: u32) -> Result<(), String> {
    use shmbroker::bindings::kind;
    let (mut raw, _own) = log_on_with_outbox(socket, rank)?;
    let (me, world) = (raw.rank(), raw.world_size());
    // Ballot 1, every member's first process.
    let members: Vec<u32> = (0..world).collect();
    let proposal = setup_message(1, 1, (stream, 0), &members, &vec![0; world as usize]);
    for peer in (0..world).filter(|&peer| peer != me) {
        send_inline(&mut raw, peer, kind::GROUP, setup_tag(0), &proposal)?;
    }
    forged()
}

fn shrink_liar(socket: &str, rank: Option<u32>, departed: u32) -> Result<(), String> {
    use shmbroker::bindings::kind;
    let (mut raw, _own) = log_on_with_outbox(socket, rank)?;
    let me = raw.rank();
    let estimate = 1u64
        .checked_shl(departed)
        .ok_or_else(|| format!("rank {departed} is past a 64-rank set"))?;
    for peer in (0..raw.world_size()).filter(|&peer| peer != me) {
        send_inline(
            &mut raw,
            peer,
            kind::SHRINK,
            setup_tag(0),
            &estimate.to_le_bytes(),
        )?;
    }
    forged()
}

/// A setup message of making a group as `agree::Setup::encode` writes it: `step` (1 propose,
/// 2 decide), the member count, `ballot`, two words of payload (a proposal's stream and zero, or
/// a decision's outcome code and value), the members, then each one's incarnation.
fn setup_message(
    step: u32,
    ballot: u64,
    (a, b): (u32, u32),
    members: &[u32],
    view: &[u32],
) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend(step.to_le_bytes());
    bytes.extend((members.len() as u32).to_le_bytes());
    bytes.extend(ballot.to_le_bytes());
    bytes.extend(a.to_le_bytes());
    bytes.extend(b.to_le_bytes());
    for word in members.iter().chain(view) {
        bytes.extend(word.to_le_bytes());
    }
    bytes
}

fn blame_liar(socket: &str, rank: Option<u32>, blame: Blame, blamed: u32) -> Result<(), String> {
    use shmbroker::bindings::kind;
    let (mut raw, _own) = log_on_with_outbox(socket, rank)?;
    let (me, world) = (raw.rank(), raw.world_size());
    if me != 0 {
        return Err(format!("rank {me}: the first coordinator is rank 0"));
    }
    let members: Vec<u32> = (0..world).collect();
    // Every member's first process; the stream an honest first group proposes.
    let view = vec![0u32; world as usize];
    let proposal = setup_message(1, 1, (1, 0), &members, &view);
    let decision = setup_message(2, 1, (blame.code(), blamed), &members, &view);
    for peer in (0..world).filter(|&peer| peer != me) {
        send_inline(&mut raw, peer, kind::GROUP, setup_tag(0), &proposal)?;
        send_inline(&mut raw, peer, kind::GROUP, setup_tag(1), &decision)?;
    }
    forged()
}

fn status_forge(socket: &str, rank: Option<u32>) -> Result<(), String> {
    use shmbroker::bindings::{STATUS_SLOT_WORDS, STATUS_SLOTS, status_word as w};
    use std::sync::atomic::Ordering::Relaxed;
    let mut raw = log_on(socket, rank)?;
    let own = Outbox::create(raw.rank(), 1 << 20).map_err(|e| e.to_string())?;
    raw.publish_outbox(own.fd(), TIMEOUT)
        .map_err(|e| e.to_string())?;
    let words = own.status();
    println!("forging");
    std::io::Write::flush(&mut std::io::stdout()).map_err(|e| e.to_string())?;
    let mut random = 0x9e37_79b9_7f4a_7c15_u64;
    let forgeries: [fn(&mut [u64; STATUS_SLOT_WORDS], u64); 5] = [
        // A terminal escape for a name.
        |slot, _| slot[w::CALL] = u64::from_le_bytes(*b"\x1b[2J\x1b[H!"),
        // A good name, started in the future.
        |slot, _| {
            slot[w::CALL] = u64::from_le_bytes(*b"barrier\0");
            slot[w::SINCE] = u64::MAX - 1;
        },
        // Every word set.
        |slot, _| *slot = [u64::MAX; STATUS_SLOT_WORDS],
        // Random words.
        |slot, random| {
            for (at, word) in slot.iter_mut().enumerate() {
                *word = random.rotate_left(at as u32 * 7) ^ at as u64;
            }
        },
        // A last call with bytes past its terminating zero.
        |slot, _| {
            slot[w::LAST_CALL] = u64::from_le_bytes(*b"recv\0zzz");
            slot[w::OUTBOX_USED] = u64::MAX;
        },
    ];
    let mut round = 0usize;
    loop {
        round = round.wrapping_add(1);
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let mut forged = [0u64; STATUS_SLOT_WORDS];
        forgeries[round % forgeries.len()](&mut forged, random);
        for slot in 0..STATUS_SLOTS {
            for (word, value) in words.slot(slot).iter().zip(forged) {
                word.store(value, Relaxed);
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn reopen(socket: &str, rank: Option<u32>) -> Result<(), String> {
    let mut raw = log_on(socket, rank)?;
    let me = raw.rank();
    let mut targets: Vec<(String, OwnedFd)> = Vec::new();
    for peer in (0..raw.world_size()).filter(|&p| p != me) {
        let fd = raw
            .take_peer_outbox(peer, TIMEOUT)
            .map_err(|e| format!("rank {peer}'s outbox: {e}"))?;
        targets.push((format!("rank {peer}'s outbox"), fd));
    }
    let own = Outbox::create(me, 1 << 20).map_err(|e| e.to_string())?;
    let own_fd = own.fd().try_clone_to_owned().map_err(|e| e.to_string())?;
    targets.push(("this rank's own outbox".into(), own_fd));
    let mut allowed = Vec::new();
    let mut attempts = 0;
    for (name, fd) in &targets {
        for (how, outcome) in attack(fd.as_fd()) {
            attempts += 1;
            if let Some(detail) = outcome {
                allowed.push(format!("{name}: {how} was allowed ({detail})"));
            }
        }
    }
    // Take part in the session like `worker --selftest --only barrier --repeat 1`.
    let mut session =
        Session::from_handshake_with(raw, 1 << 20, TIMEOUT).map_err(|e| e.to_string())?;
    session.set_timeout(TIMEOUT);
    for _ in 0..2 {
        session.barrier().map_err(|e| format!("barrier: {e}"))?;
    }
    for line in &allowed {
        println!("hostile: {line}");
    }
    if allowed.is_empty() {
        println!(
            "hostile: rank {me}: all {attempts} write attempts on {} outboxes were refused",
            targets.len()
        );
        Ok(())
    } else {
        Err(format!(
            "{} of {attempts} write attempts succeeded",
            allowed.len()
        ))
    }
}

/// Every way to write `fd`'s file; for each, `Some(what happened)` when the kernel allowed it.
fn attack(fd: BorrowedFd<'_>) -> Vec<(&'static str, Option<String>)> {
    let len = NonZeroUsize::new(4096).unwrap_or(NonZeroUsize::MIN);
    let mut outcomes = Vec::new();
    let junk = [0xA5u8; 64];
    outcomes.push((
        "write(2)",
        nix::unistd::write(fd, &junk)
            .ok()
            .map(|n| format!("{n} bytes")),
    ));
    outcomes.push((
        "pwrite(2)",
        nix::sys::uio::pwrite(fd, &junk, 128)
            .ok()
            .map(|n| format!("{n} bytes")),
    ));
    outcomes.push(("mmap(PROT_WRITE, MAP_SHARED)", writable_mapping(fd, len)));
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match open(
        path.as_str(),
        OFlag::O_RDWR | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(reopened) => {
            outcomes.push((
                "write(2) through /proc/self/fd reopened O_RDWR",
                nix::unistd::write(&reopened, &junk)
                    .ok()
                    .map(|n| format!("{n} bytes")),
            ));
            outcomes.push((
                "mmap(PROT_WRITE, MAP_SHARED) through /proc/self/fd",
                writable_mapping(reopened.as_fd(), len),
            ));
        }
        // Refused at open: nothing more to try that way.
        Err(_) => outcomes.push(("open(/proc/self/fd/N, O_RDWR)", None)),
    }
    outcomes.push((
        "mprotect(PROT_WRITE) of a read-only mapping",
        remap_writable(fd, len),
    ));
    outcomes.push(("madvise(MADV_REMOVE)", punch_by_madvise(fd, len)));
    outcomes.push((
        "fallocate(PUNCH_HOLE)",
        fallocate(
            fd,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            64,
            4096,
        )
        .ok()
        .map(|()| "hole punched".into()),
    ));
    outcomes.push((
        "ftruncate(2)",
        nix::unistd::ftruncate(fd, 64)
            .ok()
            .map(|()| "shrunk".into()),
    ));
    outcomes
}

fn writable_mapping(fd: BorrowedFd<'_>, len: NonZeroUsize) -> Option<String> {
    // SAFETY: a fresh mapping chosen by the kernel (no address hint); it is unmapped below and
    // never dereferenced.
    let ptr = unsafe {
        mmap(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            fd,
            0,
        )
    }
    .ok()?;
    // SAFETY: exactly the mapping made above.
    let _ = unsafe { munmap(ptr, len.get()) };
    Some("mapped writable".into())
}

/// Maps `fd` read-only, then asks for write access; `Some` if granted.
fn remap_writable(fd: BorrowedFd<'_>, len: NonZeroUsize) -> Option<String> {
    // SAFETY: a fresh read-only mapping chosen by the kernel, unmapped below.
    let ptr = unsafe { mmap(None, len, ProtFlags::PROT_READ, MapFlags::MAP_SHARED, fd, 0) }.ok()?;
    // SAFETY: `ptr` is the mapping just made, `len` long; only its protection changes.
    let granted = unsafe { mprotect(ptr, len.get(), ProtFlags::PROT_READ | ProtFlags::PROT_WRITE) };
    // SAFETY: exactly the mapping made above.
    let _ = unsafe { munmap(ptr, len.get()) };
    granted.ok().map(|()| "protection raised".into())
}

/// Maps `fd` read-only and asks the kernel to free its pages; `Some` if it did.
fn punch_by_madvise(fd: BorrowedFd<'_>, len: NonZeroUsize) -> Option<String> {
    // SAFETY: a fresh read-only mapping chosen by the kernel, unmapped below.
    let ptr = unsafe { mmap(None, len, ProtFlags::PROT_READ, MapFlags::MAP_SHARED, fd, 0) }.ok()?;
    // SAFETY: `ptr` is the mapping just made; MADV_REMOVE touches no memory of this process.
    let removed = unsafe { madvise(ptr, len.get(), MmapAdvise::MADV_REMOVE) };
    // SAFETY: exactly the mapping made above.
    let _ = unsafe { munmap(ptr, len.get()) };
    removed.ok().map(|()| "pages removed".into())
}

fn scribble(
    socket: &str,
    rank: Option<u32>,
    delay: Duration,
    time: Duration,
) -> Result<(), String> {
    let mut session = Session::connect(socket, rank, TIMEOUT).map_err(|e| e.to_string())?;
    session.set_timeout(TIMEOUT);
    let scribbler = std::thread::spawn(move || -> Result<(), String> {
        std::thread::sleep(delay);
        let end = Instant::now() + time;
        let passes = scribble_while(|| Instant::now() < end)?;
        println!("hostile: scribbled over shared regions {passes} times");
        std::io::Write::flush(&mut std::io::stdout()).map_err(|e| e.to_string())?;
        // Die without a goodbye (no destructor runs), leaving the peers with whatever is in
        // the rings and the outbox.
        std::process::exit(3);
    });
    // Honest meanwhile, so that the peers are in the middle of transfers when it turns; its
    // own calls fail once the scribbling starts, and it waits for the scribbler to end it all.
    let _ = shmbroker_cli::selftest::run(
        &mut session,
        u64::MAX,
        shmbroker_cli::selftest::Only::Sizes,
        1 << 20,
    );
    std::mem::forget(session);
    match scribbler.join() {
        Ok(result) => result,
        Err(_) => Err("the scribbler panicked".into()),
    }
}

/// The sizes, in f32 elements, of [`reductions_round`]: in ring slots (64 B), lent in one shot
/// (1 KiB, and 32 KiB whose three contributions stay under
/// [`shmbroker::session::tuning::LENT_ONE_SHOT_MAX_BYTES`]), and in two shots (256 KiB in one piece,
/// 2 MiB in two of [`shmbroker::session::tuning::PIECE_MAX_BYTES`]).
pub const REDUCTION_ELEMENTS: [usize; 5] = [16, 256, 8 << 10, 64 << 10, 512 << 10];

/// What rank `rank` contributes to round `round`'s reductions: small whole numbers, so that
/// every sum of a few of them is exact in f32 whatever the order.
fn contribution(rank: u32, round: u64, len: usize) -> Vec<f32> {
    (0..len)
        .map(|at| ((u64::from(rank) * 7 + round * 3 + at as u64) % 1000) as f32)
        .collect()
}

/// One round of f32 sums at every size of [`REDUCTION_ELEMENTS`]: an all-reduce of a `Vec`, one
/// of a symmetric buffer, a reduce-scatter and a reduce to rank `round % size`. Returns how many
/// of the results this rank got (every element of each checked against the sum computed here)
/// were wrong: a peer scribbling over its outbox can make them so, and nothing worse.
///
/// # Errors
///
/// What a call failed with, named.
pub fn reductions_round(
    session: &mut Session,
    round: u64,
) -> Result<u64, (&'static str, shmbroker::session::Error)> {
    use shmbroker::ReduceOp::Sum;
    let (rank, world) = (session.rank(), session.world_size());
    let root = (round % u64::from(world)) as u32;
    let mut wrong = 0u64;
    let mut tally = |got: &[f32], want: &[f32]| wrong += u64::from(got != want);
    for len in REDUCTION_ELEMENTS {
        let mut sum = vec![0f32; len];
        for peer in 0..world {
            for (total, value) in sum.iter_mut().zip(contribution(peer, round, len)) {
                *total += value;
            }
        }
        let mut data = contribution(rank, round, len);
        session
            .all_reduce(&mut data, Sum)
            .map_err(|e| ("all_reduce", e))?;
        tally(&data, &sum);
        let mut symmetric = session
            .symmetric::<f32>(len)
            .map_err(|e| ("symmetric", e))?;
        symmetric.copy_from_slice(&contribution(rank, round, len));
        session
            .all_reduce(&mut symmetric, Sum)
            .map_err(|e| ("all_reduce of a symmetric buffer", e))?;
        tally(&symmetric, &sum);
        drop(symmetric);
        let block = len / world as usize;
        let mut mine = vec![0f32; block];
        session
            .reduce_scatter(
                &contribution(rank, round, block * world as usize),
                &mut mine,
                Sum,
            )
            .map_err(|e| ("reduce_scatter", e))?;
        let mut blocks = vec![0f32; block * world as usize];
        for peer in 0..world {
            let theirs = contribution(peer, round, block * world as usize);
            for (total, value) in blocks.iter_mut().zip(theirs) {
                *total += value;
            }
        }
        let at = block * rank as usize;
        tally(&mine, &blocks[at..at + block]);
        let mut data = contribution(rank, round, len);
        session
            .reduce(root, &mut data, Sum)
            .map_err(|e| ("reduce", e))?;
        if rank == root {
            tally(&data, &sum);
        }
    }
    Ok(wrong)
}

fn outbox_garbage(socket: &str, rank: Option<u32>, rounds: u64) -> Result<(), String> {
    // An outbox of 8 MiB, for quick passes over it: at least four pieces of
    // `PIECE_MAX_BYTES` (1 MiB), so the two-shot pieces stay the peers' size.
    let raw = log_on(socket, rank)?;
    let mut session =
        Session::from_handshake_with(raw, 8 << 20, TIMEOUT).map_err(|e| e.to_string())?;
    session.set_timeout(TIMEOUT);
    // One honest round first, so that every peer has mapped this outbox: a peer refuses to map
    // one whose header is garbage, naming its owner, and the attack is on the data.
    let first =
        reductions_round(&mut session, 0).map_err(|(call, e)| format!("round 0: {call}: {e}"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scribbler = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            scribble_mappings_while("memfd:shmbroker-outbox", || {
                !stop.load(std::sync::atomic::Ordering::Relaxed)
            })
        })
    };
    // Honest but for the scribbling: its own results are garbage too, and ignored.
    let outcome = first.and_then(|_| {
        (1..rounds).try_for_each(|round| {
            reductions_round(&mut session, round)
                .map(drop)
                .map_err(|(call, e)| format!("round {round}: {call}: {e}"))
        })
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let passes = match scribbler.join() {
        Ok(passes) => passes?,
        Err(_) => return Err("the scribbler panicked".into()),
    };
    outcome?;
    session.barrier().map_err(|e| format!("barrier: {e}"))?;
    println!("hostile: scribbled over its outbox {passes} times in {rounds} rounds");
    Ok(())
}

/// Fills every shared writable mapping of a shmbroker memfd in this process (its ends of the
/// rings, its outbox) with random bytes, pass after pass, while `go_on` says so; returns the
/// passes made.
fn scribble_while(go_on: impl FnMut() -> bool) -> Result<u64, String> {
    scribble_mappings_while("memfd:shmbroker", go_on)
}

/// [`scribble_while`] over the mappings whose name starts with `name` alone.
fn scribble_mappings_while(name: &str, mut go_on: impl FnMut() -> bool) -> Result<u64, String> {
    let regions = writable_shared_memfds(name)?;
    let mut seed = u64::from(std::process::id()) | 1;
    let mut passes = 0u64;
    while go_on() {
        for &(start, len) in &regions {
            for offset in (0..len).step_by(8) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = (start + offset) as *mut u64;
                // SAFETY: `at` lies inside a shared mapping of this process that
                // /proc/self/maps lists as readable and writable (`rw-s`), 8-byte aligned
                // (mappings are page-aligned); writing it is the attack. This process's own
                // session may misbehave meanwhile: that is the attacker's business, not its
                // peers'.
                unsafe { at.write_volatile(seed) };
            }
        }
        passes += 1;
    }
    Ok(passes)
}

/// Scribbles (see `scribble_while`) until something kills this process.
pub fn scribble_until_killed() {
    let _ = scribble_while(|| true);
}

/// `(start, len)` of every shared read-write mapping in this process of a memfd whose name
/// starts with `name` (`memfd:shmbroker` for them all).
fn writable_shared_memfds(name: &str) -> Result<Vec<(usize, usize)>, String> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| e.to_string())?;
    Ok(maps
        .lines()
        .filter(|line| line.contains(name))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            if !perms.starts_with("rw") || !perms.ends_with('s') {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            Some((start, end - start))
        })
        .collect())
}
