//! `shmbroker worker`: log on, show what arrived, greet every peer over the rings.

use shmbroker::Collectives;
use shmbroker::bindings::{INLINE_BYTES, Message};
use std::time::Duration;

/// `shmbroker worker`.
#[derive(Debug, clap::Args)]
// The last of a repeated option wins (a test adds its own --timeout-ms to a launcher's).
#[command(args_override_self = true)]
#[command(group(clap::ArgGroup::new("broker").required(true).args(["socket", "from_env", "inherited_socket"])))]
pub struct Args {
    /// Log on to the broker at PATH.
    #[arg(long, value_name = "PATH")]
    socket: Option<String>,
    /// Take the rank, world size and a job-unique socket from the launcher (Open MPI, MPICH,
    /// torchrun, Slurm, or SHMBROKER_RANK/_WORLD_SIZE/_SOCKET); local rank 0 hosts the broker.
    #[arg(long)]
    from_env: bool,
    /// Log on over a socket a launcher connected and passed at fd 3.
    #[arg(long)]
    inherited_socket: bool,
    /// The rank to ask for (default: any free rank).
    #[arg(long, conflicts_with = "from_env")]
    rank: Option<u32>,
    /// Deadline of the logon and of every collective.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    timeout_ms: u64,
    /// Instead of greeting, run every collective --repeat times across the world, check every
    /// result, print a summary and exit 0; exit 1 naming the lost rank if a peer dies.
    #[arg(long)]
    selftest: bool,
    /// How many times --selftest runs each collective.
    #[arg(long, default_value_t = 1, requires = "selftest")]
    repeat: u64,
    /// Which collectives --selftest runs.
    #[arg(long, value_enum, default_value_t = crate::selftest::Only::All, requires = "selftest")]
    only: crate::selftest::Only,
    /// The largest message --selftest --only sizes sends.
    #[arg(long, default_value_t = 1 << 20, requires = "selftest")]
    max_bytes: usize,
    /// Then time each collective ROUNDS times on every rank; rank 0 prints the latencies.
    #[arg(long, value_name = "ROUNDS", requires = "selftest")]
    table: Option<usize>,
    /// Mark the process non-dumpable first (no pidfd_getfd of its fds by others without
    /// CAP_SYS_PTRACE), as processes holding secrets do.
    #[arg(long)]
    non_dumpable: bool,
}

/// Message kind of the greeting.
const HELLO: u32 = 1;

pub fn run(args: &Args) -> Result<(), String> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let rank = args.rank;
    if args.non_dumpable {
        // As a process that handles secrets would: no core dumps, no ptrace-class access (and so
        // no pidfd_getfd) by processes without CAP_SYS_PTRACE.
        // SAFETY: prctl(PR_SET_DUMPABLE, 0) changes a flag of this process only.
        if unsafe { nix::libc::prctl(nix::libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
            return Err(format!(
                "prctl(PR_SET_DUMPABLE): {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    // clap lets exactly one of the three through.
    let mut session = match &args.socket {
        Some(socket) => shmbroker::Session::connect(socket, rank, timeout),
        None if args.from_env => shmbroker::Session::from_env(timeout),
        None => inherited_session(rank, timeout),
    }
    .map_err(|e| format!("logon: {e}"))?;
    session.set_timeout(timeout);
    if args.selftest {
        let summary = crate::selftest::run(&mut session, args.repeat, args.only, args.max_bytes)?;
        println!("[worker pid {}] {summary}", std::process::id());
        if let Some(rounds) = args.table.filter(|&rounds| rounds > 0) {
            let timings = crate::selftest::timings(&mut session, rounds)?;
            session
                .barrier()
                .map_err(|e| format!("final barrier: {e}"))?;
            if session.rank() == 0 {
                print!(
                    "{}",
                    crate::selftest::format_table(session.world_size(), rounds, &timings)
                );
            }
        }
        return Ok(());
    }

    let me = std::process::id();
    let outbox_bytes = session.outbox_bytes();
    let session = session.raw();
    let (rank, world) = (session.rank(), session.world_size());
    println!(
        "[worker pid {me}] rank {rank} of {world}: {} rings of {} slots, an outbox of {} MiB",
        2 * (world - 1),
        session.ring_capacity(),
        outbox_bytes >> 20
    );
    let mut greeting = [0u8; INLINE_BYTES];
    let text = format!("hello from rank {rank}");
    greeting[..text.len()].copy_from_slice(text.as_bytes());
    for peer in (0..world).filter(|&p| p != rank) {
        let message = Message {
            kind: HELLO,
            len: text.len() as u32,
            tag: u64::from(rank),
            inline: greeting,
        };
        let link = session.link(peer).ok_or("missing link")?;
        link.to
            .send_timeout(message, timeout)
            .map_err(|e| format!("greeting rank {peer}: {e}"))?;
    }
    for peer in (0..world).filter(|&p| p != rank) {
        let link = session.link(peer).ok_or("missing link")?;
        let message = link
            .from
            .recv_timeout(timeout)
            .map_err(|e| format!("waiting for rank {peer}: {e}"))?;
        let len = (message.len as usize).min(INLINE_BYTES);
        let text = String::from_utf8_lossy(&message.inline[..len]);
        if message.kind != HELLO || message.tag != u64::from(peer) {
            return Err(format!(
                "rank {peer} sent kind {} tag {}",
                message.kind, message.tag
            ));
        }
        println!("[worker pid {me}] rank {rank} got \"{text}\"");
    }
    println!(
        "[worker pid {me}] rank {rank} exchanged a message with each of {} peers",
        world - 1
    );
    Ok(())
}

/// Logs on over a socket already connected to the broker and inherited at fd 3 (a launcher
/// connected it and handed it over).
fn inherited_session(
    rank: Option<u32>,
    timeout: Duration,
) -> Result<shmbroker::Session, shmbroker::Error> {
    let fd = crate::process::inherited_fd(0).map_err(|source| shmbroker::Error::Io {
        what: "taking the socket inherited at fd 3",
        source,
    })?;
    let logon = shmbroker::bindings::LogonFrame::new(rank.unwrap_or(shmbroker::bindings::ANY_RANK));
    let inner = shmbroker::handshake::connect_stream(
        std::os::unix::net::UnixStream::from(fd),
        logon,
        timeout,
    )?;
    shmbroker::Session::from_handshake_with(
        inner,
        shmbroker::session::outbox_bytes_from_env()?,
        timeout,
    )
}
