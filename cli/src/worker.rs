//! `shmbroker worker`: log on, show what arrived, greet every peer over the rings.

use crate::args::Args;
use shmbroker::bindings::{INLINE_BYTES, Message};
use std::time::Duration;

pub const USAGE: &str = "\
shmbroker worker (--socket PATH [--rank R] | --from-env | --inherited-socket [--rank R])
                 [--timeout-ms MS]
                 [--selftest [--repeat N] [--only all|barrier|all_gather|fds|sizes|echo] [--max-bytes N]
                             [--table ROUNDS]]
    Log on to the broker at PATH (as rank R, or any free rank), print the rank and what was
    received, exchange one message with every peer over the rings, and exit 0.
    --from-env takes the rank, world size and a job-unique socket from the launcher (Open MPI,
    MPICH, torchrun, Slurm, or SHMBROKER_RANK/_WORLD_SIZE/_SOCKET); local rank 0 hosts the broker.
    --inherited-socket logs on over a socket a launcher connected and passed at fd 3.
    --selftest instead runs every collective N times (default 1) across the world, checks every
    result, prints a summary and exits 0; if a peer dies it exits 1 naming the lost rank.
    --table then times each collective ROUNDS times on every rank; rank 0 prints the latencies.
    --non-dumpable marks the process non-dumpable first (no pidfd_getfd of its fds by others
    without CAP_SYS_PTRACE), as processes holding secrets do.";

/// Message kind of the greeting.
const HELLO: u32 = 1;

pub fn run(rest: &[String]) -> Result<(), String> {
    let mut args = Args::new(rest);
    let socket = args.value::<String>("--socket")?;
    let from_env = args.flag("--from-env");
    let rank = args.value::<u32>("--rank")?;
    let timeout = Duration::from_millis(args.value("--timeout-ms")?.unwrap_or(30_000));
    let selftest = args.flag("--selftest");
    let repeat = args.value::<u64>("--repeat")?.unwrap_or(1);
    let only = args
        .value::<crate::selftest::Only>("--only")?
        .unwrap_or(crate::selftest::Only::All);
    let max_bytes = args.value::<usize>("--max-bytes")?.unwrap_or(1 << 20);
    let table = args.value::<usize>("--table")?;
    let non_dumpable = args.flag("--non-dumpable");
    let inherited = args.flag("--inherited-socket");
    args.finish()?;
    if non_dumpable {
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
    let mut session = match (from_env, socket) {
        (false, None) if inherited => inherited_session(rank, timeout),
        (true, None) => shmbroker::Session::from_env(timeout),
        (false, Some(socket)) => shmbroker::Session::connect(&socket, rank, timeout),
        _ => {
            return Err(format!(
                "worker needs either --socket or --from-env\n{USAGE}"
            ));
        }
    }
    .map_err(|e| format!("logon: {e}"))?;
    session.set_timeout(timeout);
    if selftest {
        let summary = crate::selftest::run(&mut session, repeat, only, max_bytes)?;
        println!("[worker pid {}] {summary}", std::process::id());
        if let Some(rounds) = table.filter(|&rounds| rounds > 0) {
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
    let fd = shmbroker::process::inherited_fd(0)
        .map_err(|e| shmbroker::Error::Misuse(format!("no socket inherited at fd 3: {e}")))?;
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
