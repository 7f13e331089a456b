//! `shmbroker worker --selftest`: every collective, checked, N times.

use shmbroker::Collectives;
use shmbroker::session::{Error, Session};
use std::time::Instant;

/// Which collectives to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Only {
    All,
    Barrier,
    #[value(name = "all_gather")]
    AllGather,
    Fds,
    /// Every operation at every size of [`SIZES`] up to `--max-bytes`, every root (the all-reduce
    /// to 4 MiB).
    Sizes,
    /// Ranks other than 0 send back every message rank 0 sends them, `--repeat` times.
    Echo,
}

/// The sizes `--only sizes` checks: around the inline slot (48), around the eager limit (4 KiB),
/// one and many chunks.
pub const SIZES: [usize; 9] = [0, 1, 47, 48, 49, 4096, 4097, 1 << 20, 64 << 20];

/// The largest all-reduce `--only sizes` checks.
const ALL_REDUCE_MAX: usize = 4 << 20;

/// A sealed memfd holding `bytes`.
pub fn memfd_with(bytes: &[u8]) -> Result<std::os::fd::OwnedFd, String> {
    use std::os::unix::fs::FileExt;
    let fd = shmbroker::queues::memfd::create_sealed(c"selftest", bytes.len() as u64)
        .map_err(|e| e.to_string())?;
    let file = std::fs::File::from(fd.try_clone().map_err(|e| e.to_string())?);
    file.write_all_at(bytes, 0).map_err(|e| e.to_string())?;
    Ok(fd)
}

/// What the file behind `fd` holds (32 bytes at most).
fn contents(fd: &std::os::fd::OwnedFd) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::from(fd.try_clone().map_err(|e| e.to_string())?);
    let mut bytes = vec![0u8; 32];
    let n = file.read_at(&mut bytes, 0).map_err(|e| e.to_string())?;
    bytes.truncate(n);
    Ok(bytes)
}

/// Bytes that name who made them, for which iteration, at which length. The pattern repeats
/// every 251 bytes (a prime, so a chunk misplaced by any power of two shows), and is built by
/// copying, so 64 MiB of it is quick even unoptimised.
fn pattern(who: u32, iteration: u64, len: usize) -> Vec<u8> {
    let seed = u64::from(who) * 31 + iteration * 7 + len as u64 * 13;
    let period: Vec<u8> = (0..251u64).map(|j| (seed + j * 3) as u8).collect();
    let mut bytes = period.repeat(len / 251 + 1);
    bytes.truncate(len);
    bytes
}

fn check(what: &str, peer: u32, got: &[u8], want: &[u8]) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{what}: data from rank {peer} is wrong ({} bytes, expected {})",
            got.len(),
            want.len()
        ))
    }
}

/// Exchanges a memfd holding this rank's pattern with every rank and checks what each holds;
/// returns this rank's memfd.
fn exchange_fds_checked(session: &mut Session, i: u64) -> Result<std::os::fd::OwnedFd, String> {
    let rank = session.rank();
    let mine = memfd_with(&pattern(rank, i, 32)).map_err(|e| format!("memfd: {e}"))?;
    let all = session
        .exchange_fds(std::os::fd::AsFd::as_fd(&mine))
        .map_err(|e| format!("exchange_fds: {e}"))?;
    for (peer, fd) in (0u32..).zip(&all) {
        check("exchange_fds", peer, &contents(fd)?, &pattern(peer, i, 32))?;
    }
    Ok(mine)
}

/// Runs the selftest; returns a summary line or what failed.
pub fn run(
    session: &mut Session,
    repeat: u64,
    only: Only,
    max_bytes: usize,
) -> Result<String, String> {
    let (rank, world) = (session.rank(), session.world_size());
    let fail = |what: &str, e: Error| format!("{what}: {e}");
    let start = Instant::now();
    let mut checks = 0u64;
    for i in 0..repeat {
        if only == Only::Echo {
            if rank != 0 {
                let message = session.recv(0).map_err(|e| fail("recv", e))?;
                session.send(0, &message).map_err(|e| fail("send", e))?;
                checks += 1;
            }
            continue;
        }
        if only == Only::Sizes {
            for len in SIZES.into_iter().filter(|&len| len <= max_bytes) {
                checks += every_operation_at(session, i, len)?;
            }
            continue;
        }
        if only == Only::Fds {
            exchange_fds_checked(session, i)?;
            checks += 1;
            continue;
        }
        if only != Only::AllGather {
            session.barrier().map_err(|e| fail("barrier", e))?;
            checks += 1;
        }
        if only == Only::Barrier {
            continue;
        }
        // Inline, eager in several slots, and sizes that differ by rank (any size goes: 100 B
        // per rank is pipelined from rank 41 on).
        for step in 0..6 {
            let len_of = |peer: u32| match step {
                5 => 100 * peer as usize,
                _ => [8usize, 48, 49, 1024, 4096][step],
            };
            let all = session
                .all_gather(&pattern(rank, i, len_of(rank)))
                .map_err(|e| fail("all_gather", e))?;
            for (peer, got) in (0u32..).zip(&all) {
                check("all_gather", peer, got, &pattern(peer, i, len_of(peer)))?;
            }
            checks += 1;
        }
        if only == Only::AllGather {
            continue;
        }
        let mut flat = vec![0u8; 64 * world as usize];
        session
            .all_gather_into(&pattern(rank, i, 64), &mut flat)
            .map_err(|e| fail("all_gather_into", e))?;
        for (peer, part) in (0u32..).zip(flat.chunks_exact(64)) {
            check("all_gather_into", peer, part, &pattern(peer, i, 64))?;
        }
        checks += 1;
        let values = session
            .all_gather_pod(&(u64::from(rank) * 1000 + i))
            .map_err(|e| fail("all_gather_pod", e))?;
        for (peer, value) in (0u32..).zip(values) {
            if value != u64::from(peer) * 1000 + i {
                return Err(format!("all_gather_pod: rank {peer} gave {value}"));
            }
        }
        checks += 1;
        for root in 0..world {
            for len in [16usize, 3000] {
                let mine = pattern(root, i, len);
                let data = (root == rank).then_some(mine.as_slice());
                let got = session
                    .broadcast(root, data)
                    .map_err(|e| fail("broadcast", e))?;
                check("broadcast", root, &got, &mine)?;
                checks += 1;
            }
        }
        // File descriptors: every rank's memfd to everyone, then one rank's to all.
        let mine = exchange_fds_checked(session, i)?;
        checks += 1;
        let root = (i % u64::from(world)) as u32;
        let offered = (root == rank).then_some(std::os::fd::AsFd::as_fd(&mine));
        let got = session
            .broadcast_fd(root, offered)
            .map_err(|e| fail("broadcast_fd", e))?;
        check(
            "broadcast_fd",
            root,
            &contents(&got)?,
            &pattern(root, i, 32),
        )?;
        checks += 1;
        if world > 1 {
            let (next, previous) = ((rank + 1) % world, (rank + world - 1) % world);
            for len in [5usize, 2000] {
                session
                    .send(next, &pattern(rank, i, len))
                    .map_err(|e| fail("send", e))?;
                let got = session.recv(previous).map_err(|e| fail("recv", e))?;
                check("send/recv", previous, &got, &pattern(previous, i, len))?;
                checks += 1;
            }
        }
    }
    session.barrier().map_err(|e| fail("final barrier", e))?;
    Ok(format!(
        "selftest: rank {rank} of {world}: {checks} collectives checked over {repeat} rounds, all passed in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    ))
}

/// Every data-carrying operation once with `len` bytes per rank (and every root); returns how
/// many were checked.
fn every_operation_at(session: &mut Session, i: u64, len: usize) -> Result<u64, String> {
    let (rank, world) = (session.rank(), session.world_size());
    let fail = |what: &str, e: Error| format!("{what} of {len} bytes: {e}");
    let mut checks = 0;
    let mine = pattern(rank, i, len);
    let all = session
        .all_gather(&mine)
        .map_err(|e| fail("all_gather", e))?;
    for (peer, got) in (0u32..).zip(&all) {
        check("all_gather", peer, got, &pattern(peer, i, len))?;
    }
    drop(all);
    let mut flat = vec![0u8; len * world as usize];
    session
        .all_gather_into(&mine, &mut flat)
        .map_err(|e| fail("all_gather_into", e))?;
    for (peer, part) in (0u32..).zip(flat.chunks(len.max(1))) {
        check("all_gather_into", peer, part, &pattern(peer, i, len))?;
    }
    drop(flat);
    // Every rank's bytes summed (wrapping), element by element, to 4 MiB (`tests/reductions.rs`
    // has 64 MiB; a test build combines 64 MiB of bytes slowly). Every pattern repeats every
    // 251 bytes, and so does the sum.
    if len <= ALL_REDUCE_MAX {
        let mut sum = mine.clone();
        session
            .all_reduce(&mut sum, shmbroker::ReduceOp::Sum)
            .map_err(|e| fail("all_reduce", e))?;
        let mut period = vec![0u8; len.min(251)];
        for peer in 0..world {
            for (total, byte) in period.iter_mut().zip(pattern(peer, i, len)) {
                *total = total.wrapping_add(byte);
            }
        }
        let mut want = period.repeat(len / 251 + 1);
        want.truncate(len);
        if sum != want {
            let at = sum.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "all_reduce of {len} bytes: byte {at} is {}, the sum of every rank's is {}",
                sum[at], want[at]
            ));
        }
        checks += 1;
    }
    checks += 2;
    for root in 0..world {
        let theirs = pattern(root, i, len);
        let data = (root == rank).then_some(mine.as_slice());
        let got = session
            .broadcast(root, data)
            .map_err(|e| fail("broadcast", e))?;
        check("broadcast", root, &got, &theirs)?;
        if let Some(gathered) = session.gather(root, &mine).map_err(|e| fail("gather", e))? {
            for (peer, got) in (0u32..).zip(&gathered) {
                check("gather", peer, got, &pattern(peer, i, len))?;
            }
        }
        let lent = if len > session.max_loan_bytes() {
            None
        } else if root == rank {
            let mut loan = session.loan(len).map_err(|e| fail("loan", e))?;
            loan.copy_from_slice(&mine);
            session
                .broadcast_loan(root, Some(loan))
                .map_err(|e| fail("broadcast_loan", e))?
        } else {
            session
                .broadcast_loan(root, None)
                .map_err(|e| fail("broadcast_loan", e))?
        };
        if let Some(view) = lent {
            check("broadcast_loan", root, &view, &theirs)?;
        }
        checks += 3;
    }
    if world > 1 {
        let (next, previous) = ((rank + 1) % world, (rank + world - 1) % world);
        let want = pattern(previous, i, len);
        // Even ranks send first, odd ones receive first: a send larger than the outbox waits
        // for its receiver (as MPI_Send may), so a ring of ranks that all send first would not.
        let mut buffer = vec![0u8; len + 7];
        let mut received = 0;
        for turn in [rank % 2 == 0, rank % 2 != 0] {
            if turn {
                session.send(next, &mine).map_err(|e| fail("send", e))?;
                session.send(next, &mine).map_err(|e| fail("send", e))?;
            } else {
                let got = session.recv(previous).map_err(|e| fail("recv", e))?;
                check("send/recv", previous, &got, &want)?;
                received = session
                    .recv_into(previous, &mut buffer)
                    .map_err(|e| fail("recv_into", e))?;
            }
        }
        check("recv_into", previous, &buffer[..received], &want)?;
        checks += 2;
        if len <= session.max_loan_bytes() {
            let mut loan = session.loan(len).map_err(|e| fail("loan", e))?;
            loan.copy_from_slice(&mine);
            session
                .send_loan(next, loan)
                .map_err(|e| fail("send_loan", e))?;
            let view = session
                .recv_loan(previous)
                .map_err(|e| fail("recv_loan", e))?;
            check("recv_loan", previous, &view, &want)?;
            checks += 1;
        }
    }
    Ok(checks)
}

/// Times each collective over `rounds` calls on every rank; returns (step, p50 ns, p99 ns).
pub fn timings(session: &mut Session, rounds: usize) -> Result<Vec<(String, u64, u64)>, String> {
    let (rank, world) = (session.rank(), session.world_size());
    let fail = |what: &str, e: Error| format!("timing {what}: {e}");
    let small = [7u8; 8];
    let large = vec![7u8; 1024];
    let mut table = Vec::new();
    let mut time = |name: String, op: &mut dyn FnMut(&mut Session) -> Result<(), Error>| {
        session.barrier().map_err(|e| fail("barrier", e))?;
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let start = Instant::now();
            op(session).map_err(|e| fail(&name, e))?;
            samples.push(start.elapsed().as_nanos() as u64);
        }
        samples.sort_unstable();
        let at = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
        table.push((name, at(50), at(99)));
        Ok::<(), String>(())
    };
    time("barrier".into(), &mut |s| s.barrier())?;
    time("all_gather 8 B".into(), &mut |s| {
        s.all_gather(&small).map(drop)
    })?;
    time("all_gather 1 KiB".into(), &mut |s| {
        s.all_gather(&large).map(drop)
    })?;
    time("broadcast 8 B from rank 0".into(), &mut |s| {
        s.broadcast(0, (rank == 0).then_some(&small[..])).map(drop)
    })?;
    time("broadcast 1 KiB from rank 0".into(), &mut |s| {
        s.broadcast(0, (rank == 0).then_some(&large[..])).map(drop)
    })?;
    let memory = memfd_with(&[rank as u8; 32])?;
    let fd = std::os::fd::AsFd::as_fd(&memory);
    time("exchange_fds (a memfd each)".into(), &mut |s| {
        s.exchange_fds(fd).map(drop)
    })?;
    let handle = shmbroker::bindings::GpuHandle {
        kind: shmbroker::bindings::GpuHandleKind::HostMemfd as u32,
        flags: 0,
        device_uuid: [rank as u8; 16],
        handle: [0; shmbroker::bindings::GPU_HANDLE_BYTES],
        size: 32,
        offset: 0,
        buffer_id: 0,
    };
    time("all_gather_gpu_handles (host memfd)".into(), &mut |s| {
        s.all_gather_gpu_handles(&handle, Some(fd)).map(drop)
    })?;
    if world > 1 {
        let (next, previous) = ((rank + 1) % world, (rank + world - 1) % world);
        time("send + recv 8 B around the ring".into(), &mut |s| {
            s.send(next, &small)?;
            s.recv(previous).map(drop)
        })?;
    }
    Ok(table)
}

/// The table rank 0 prints.
pub fn format_table(world: u32, rounds: usize, table: &[(String, u64, u64)]) -> String {
    let micros = |ns: u64| format!("{:.1} µs", ns as f64 / 1e3);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut out = format!(
        "collectives across {world} worker processes on {cores} cores, {rounds} calls each (times on rank 0;\n\
         with more processes than cores, waits park after spinning, so times include wake-ups):\n  {:<34} {:>10} {:>10}\n",
        "step", "p50", "p99"
    );
    for (name, p50, p99) in table {
        out.push_str(&format!(
            "  {name:<34} {:>10} {:>10}\n",
            micros(*p50),
            micros(*p99)
        ));
    }
    out
}
