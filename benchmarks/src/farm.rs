//! `bench farm`: a reader handing tasks to whichever worker answers, waking an event
//! loop, and looking for a message when there is none.
//!
//! | bench | ours | baselines |
//! |---|---|---|
//! | `farm` (1 reader, 3 workers; 64 B, 4 KiB, 64 KiB tasks) | `recv_any_into` for the answers, `send` for the next task, tasks per second | the same loop with `MPI_ANY_SOURCE` (`mpi/farm.c`, `open-mpi`); one UNIX stream socket per worker and `poll` over them (`unix socket`) |
//! | `readiness_wake` (2 ranks, 8 B) | a ping-pong where each side sleeps in `epoll_wait` on its `readiness_fd` and takes the message with `try_recv_any` | a ping-pong of two eventfds, each side sleeping in `epoll_wait` on its own |
//! | `try_recv_any_idle` (8 peers, nothing sent) | `try_recv_any` | `try_recv` on each of the 8 peers in turn, which is what a caller without `try_recv_any` would write |
//!
//! # The farm
//!
//! Every contender runs the same loop ([`read_farm`] and [`work_farm`]): the reader gives each
//! worker [`DEPTH`] tasks, then for each answer, from whichever worker it comes, hands that worker
//! the next task. A task's first 8 bytes are its id and its last byte the id's low byte; the
//! answer is 16 bytes, the id and `len * 31 + last byte`, and the reader checks every answer
//! against the task it gave that worker least recently. Workers do no other work: the figure is
//! what the hand-offs cost. 4 processes share the machine's CPUs (2 on CI), so the workers'
//! waiting matters as much as the copies: every contender sleeps when it has nothing to do.
//!
//! Tasks per second counts the answers after the first tenth (the warm-up) on the reader's
//! clock. Each round is a fresh set of processes.

use super::bulk::{batched, two_ranks};
use super::workers::{connect, fork_workers, open_mpi, reap, warmup, with_broker};
use super::{Comparison, Measure, Plan, Report, Run, Size, alternate, fork_pair};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use shmbroker::session::Session;
use shmbroker_sys::{TempDir, eventfd};
use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Workers in the farm.
const WORKERS: u32 = 3;

/// Tasks each worker holds at once: enough that a worker finds its next task waiting when it
/// answers, as in a farm that keeps its workers busy.
const DEPTH: usize = 4;

/// Bytes of an answer: the task's id and its check.
const ANSWER: usize = 16;

/// How long any one wait in these benches may take before the bench fails.
const TIMEOUT: Duration = Duration::from_secs(20);

pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    let dir = TempDir::new("bench-farm").map_err(|e| e.to_string())?;
    let sockets = std::cell::Cell::new(0u32);
    let socket = || {
        sockets.set(sockets.get() + 1);
        dir.path().join(format!("farm-{}.sock", sockets.get()))
    };
    if plan.wants("farm") {
        let mpi = open_mpi("farm", super::mpi::FARM_C);
        for bytes in [64usize, 4 << 10, 64 << 10] {
            report.progress(&format!("farm, {WORKERS} workers, {bytes} B tasks"));
            let tasks = farm_tasks(plan, bytes);
            let ours = || ours_farm(&socket(), bytes, tasks).map(rate_of);
            let unix = || unix_farm(bytes, tasks).map(rate_of);
            let mut runs: Vec<(&'static str, Run<'_>)> =
                vec![("shmbroker", &ours), ("unix socket", &unix)];
            let open_mpi = mpi
                .as_ref()
                .map(|program| move || mpi_farm(program, bytes, tasks).map(rate_of));
            if let Some(open_mpi) = &open_mpi {
                runs.push(("open-mpi", open_mpi));
            }
            let contenders = alternate(plan, &runs)?;
            report.add(Comparison {
                bench: "farm".into(),
                size: Size::Tasks {
                    workers: WORKERS,
                    bytes,
                },
                contenders,
            });
        }
        report.note(
            "farm",
            &format!(
                "tasks per second, 1 reader and {WORKERS} worker processes, {DEPTH} tasks \
                 outstanding per worker, every answer checked; each round is a fresh set of \
                 processes; the size column is workers x task bytes"
            ),
        );
    }
    if plan.wants("readiness_wake") {
        report.progress("readiness_wake");
        let rounds = plan.size(5_000, 500);
        let ours = || readiness_pingpong(&socket(), rounds).map(Measure::latency);
        let raw = || eventfd_pingpong(rounds).map(Measure::latency);
        let contenders = alternate(plan, &[("shmbroker", &ours), ("eventfd ping-pong", &raw)])?;
        report.add(Comparison {
            bench: "readiness_wake".into(),
            size: Size::Bytes(8),
            contenders,
        });
        report.note(
            "readiness_wake",
            "round trip between two processes that each sleep in epoll_wait before every \
             message; ours sends 8 bytes and takes them with try_recv_any, woken through \
             readiness_fd; the baseline writes the other side's eventfd and reads its own",
        );
    }
    if plan.wants("try_recv_any_idle") {
        report.progress("try_recv_any_idle, 8 peers");
        let calls = plan.size(2_000_000, 200_000);
        let contenders = try_recv_idle(plan, &socket(), 8, calls)?;
        report.add(Comparison {
            bench: "try_recv_any_idle".into(),
            size: Size::Peers(8),
            contenders,
        });
        report.note(
            "try_recv_any_idle",
            "nanoseconds per call with 8 peers connected and nothing sent, each sample the \
             mean of 1 000 calls; both contenders alternate in one session of 9 processes",
        );
    }
    Ok(())
}

/// Timed tasks per round: about 64 MiB of tasks, from 5 000 to 50 000 (a tenth of that under
/// `--quick`).
fn farm_tasks(plan: Plan<'_>, bytes: usize) -> usize {
    let full = ((64 << 20) / bytes).clamp(5_000, 50_000);
    plan.size(full, full / 10)
}

fn rate_of(tasks_per_s: f64) -> Measure {
    Measure::Throughput(vec![tasks_per_s])
}

/// What the reader knows of the tasks it handed out.
struct Ledger {
    /// Each worker's tasks not yet answered, oldest first (index: rank - 1).
    outstanding: Vec<VecDeque<u64>>,
    /// The id of the next task.
    next: u64,
    answered: usize,
}

impl Ledger {
    /// Fills `task` as the next task for `worker` and records it.
    fn hand_out(&mut self, worker: u32, task: &mut [u8]) {
        let id = self.next;
        self.next += 1;
        task[..8].copy_from_slice(&id.to_le_bytes());
        if let Some(last) = task.last_mut() {
            *last = id as u8;
        }
        self.outstanding[worker as usize - 1].push_back(id);
    }

    /// Checks `answer` from `worker` against the task it was given least recently.
    fn check(&mut self, worker: u32, answer: &[u8], bytes: usize) -> Result<(), String> {
        let id = worker
            .checked_sub(1)
            .and_then(|index| self.outstanding.get_mut(index as usize))
            .and_then(VecDeque::pop_front)
            .ok_or_else(|| format!("an answer from rank {worker}, which has no task"))?;
        let expected = answer_to(id, bytes, id as u8);
        if answer == expected {
            self.answered += 1;
            Ok(())
        } else {
            Err(format!(
                "rank {worker} answered task {id} with {answer:?}, expected {expected:?}"
            ))
        }
    }
}

/// The answer to the task `id` of `len` bytes whose last byte is `last`.
fn answer_to(id: u64, len: usize, last: u8) -> [u8; ANSWER] {
    let mut answer = [0u8; ANSWER];
    answer[..8].copy_from_slice(&id.to_le_bytes());
    answer[8..].copy_from_slice(&(len as u64 * 31 + u64::from(last)).to_le_bytes());
    answer
}

/// The reader's side of the farm: hands out `warmup(tasks) + tasks` tasks of `bytes` bytes to
/// ranks 1..=WORKERS through `send`, taking answers through `recv_any` (which fills a buffer and
/// says from which rank). Returns the tasks per second after the warm-up.
fn read_farm(
    bytes: usize,
    tasks: usize,
    mut send: impl FnMut(u32, &[u8]) -> Result<(), String>,
    mut recv_any: impl FnMut(&mut [u8; ANSWER]) -> Result<u32, String>,
) -> Result<f64, String> {
    let warm = warmup(tasks);
    let total = warm + tasks;
    let mut ledger = Ledger {
        outstanding: vec![VecDeque::new(); WORKERS as usize],
        next: 0,
        answered: 0,
    };
    let mut task = vec![0xa5u8; bytes];
    for _ in 0..DEPTH {
        for worker in 1..=WORKERS {
            ledger.hand_out(worker, &mut task);
            send(worker, &task)?;
        }
    }
    let mut handed = DEPTH * WORKERS as usize;
    let mut answer = [0u8; ANSWER];
    let mut start = Instant::now();
    while ledger.answered < total {
        let worker = recv_any(&mut answer)?;
        ledger.check(worker, &answer, bytes)?;
        if ledger.answered == warm {
            start = Instant::now();
        }
        if handed < total {
            ledger.hand_out(worker, &mut task);
            send(worker, &task)?;
            handed += 1;
        }
    }
    Ok(tasks as f64 / start.elapsed().as_secs_f64())
}

/// A worker's side of the farm: answers every task `recv` gives (into a buffer of `bytes`
/// bytes; `None` is the reader's stop) through `send`.
fn work_farm(
    bytes: usize,
    mut recv: impl FnMut(&mut [u8]) -> Result<Option<usize>, String>,
    mut send: impl FnMut(&[u8; ANSWER]) -> Result<(), String>,
) -> Result<(), String> {
    let mut task = vec![0u8; bytes];
    while let Some(len) = recv(&mut task)? {
        let task = task.get(..len).ok_or("a task longer than the buffer")?;
        let (Some(id), Some(&last)) = (task.get(..8), task.last()) else {
            return Err(format!("a task of {len} bytes, shorter than its id"));
        };
        let id = u64::from_le_bytes(id.try_into().map_err(|_| "an id of 8 bytes")?);
        send(&answer_to(id, len, last))?;
    }
    Ok(())
}

/// The farm over sessions: answers come with `recv_any_into`; an empty message stops a worker.
fn ours_farm(socket: &Path, bytes: usize, tasks: usize) -> Result<f64, String> {
    let e = |e: shmbroker::Error| e.to_string();
    with_broker(
        socket,
        WORKERS + 1,
        |rank| {
            let session = std::cell::RefCell::new(connect(socket, rank, None)?);
            work_farm(
                bytes,
                |task| {
                    let len = session.borrow_mut().recv_into(0, task).map_err(e)?;
                    Ok((len > 0).then_some(len))
                },
                |answer| session.borrow_mut().send(0, answer).map_err(e),
            )
        },
        || {
            let session = std::cell::RefCell::new(connect(socket, 0, None)?);
            let rate = read_farm(
                bytes,
                tasks,
                |worker, task| session.borrow_mut().send(worker, task).map_err(e),
                |answer| {
                    let (from, len) = session.borrow_mut().recv_any_into(answer).map_err(e)?;
                    if len == ANSWER {
                        Ok(from)
                    } else {
                        Err(format!("an answer of {len} bytes from rank {from}"))
                    }
                },
            )?;
            for worker in 1..=WORKERS {
                session.borrow_mut().send(worker, &[]).map_err(e)?;
            }
            Ok(rate)
        },
    )
}

/// Writes one task: its length (4 bytes) and its bytes, in one `writev` when the socket takes
/// it all.
fn write_frame(stream: &mut UnixStream, task: &[u8]) -> std::io::Result<()> {
    let header = u32::try_from(task.len())
        .map_err(|_| std::io::Error::other("a task over 4 GiB"))?
        .to_le_bytes();
    let written = stream.write_vectored(&[IoSlice::new(&header), IoSlice::new(task)])?;
    if written < header.len() {
        stream.write_all(&header[written..])?;
        stream.write_all(task)
    } else {
        stream.write_all(&task[written - header.len()..])
    }
}

/// The farm over one UNIX stream socket pair per worker: tasks framed by their length (0 stops
/// the worker), answers 16 bytes each; the reader `poll`s every socket and serves the ready ones
/// round-robin, as a hand-written event loop would.
fn unix_farm(bytes: usize, tasks: usize) -> Result<f64, String> {
    let io = |what: &'static str| move |e: std::io::Error| format!("{what}: {e}");
    let pairs = (0..WORKERS)
        .map(|_| UnixStream::pair().map_err(io("socketpair")))
        .collect::<Result<Vec<_>, _>>()?;
    let pids = fork_workers(WORKERS + 1, |rank| {
        // Only its own end stays open here, so each socket sees the others' ends close.
        for (index, (reader, worker)) in pairs.iter().enumerate() {
            if index + 1 != rank as usize {
                let _ = nix::unistd::close(worker.as_raw_fd());
            }
            let _ = nix::unistd::close(reader.as_raw_fd());
        }
        let stream = std::cell::RefCell::new(&pairs[rank as usize - 1].1);
        stream
            .borrow()
            .set_read_timeout(Some(TIMEOUT))
            .map_err(io("timeout"))?;
        work_farm(
            bytes,
            |task| {
                let mut stream = stream.borrow_mut();
                let mut header = [0u8; 4];
                stream.read_exact(&mut header).map_err(io("task length"))?;
                let len = u32::from_le_bytes(header) as usize;
                if len == 0 {
                    return Ok(None);
                }
                let task = task.get_mut(..len).ok_or("a task longer than any sent")?;
                stream.read_exact(task).map_err(io("task"))?;
                Ok(Some(len))
            },
            |answer| stream.borrow_mut().write_all(answer).map_err(io("answer")),
        )
    })?;
    let (readers, workers): (Vec<UnixStream>, Vec<UnixStream>) = pairs.into_iter().unzip();
    drop(workers);
    let readers = std::cell::RefCell::new(readers);
    let mut next = 0usize;
    let measured = read_farm(
        bytes,
        tasks,
        |worker, task| {
            write_frame(&mut readers.borrow_mut()[worker as usize - 1], task).map_err(io("task"))
        },
        |answer| {
            let mut readers = readers.borrow_mut();
            let ready = ready_in_turn(&readers, next)?;
            next = ready + 1;
            readers[ready].read_exact(answer).map_err(io("answer"))?;
            Ok(ready as u32 + 1)
        },
    );
    let mut readers = readers.into_inner();
    for reader in &mut readers {
        let _ = write_frame(reader, &[]);
    }
    drop(readers);
    let reaped = reap(&pids);
    let rate = measured?;
    reaped?;
    Ok(rate)
}

/// The first of `streams` with something to read, looking from index `from` round-robin;
/// waits in `poll` for up to [`TIMEOUT`].
fn ready_in_turn(streams: &[UnixStream], from: usize) -> Result<usize, String> {
    let mut fds: Vec<PollFd<'_>> = streams
        .iter()
        .map(|stream| PollFd::new(stream.as_fd(), PollFlags::POLLIN))
        .collect();
    let ready = poll(
        &mut fds,
        PollTimeout::try_from(TIMEOUT).unwrap_or(PollTimeout::MAX),
    )
    .map_err(|e| format!("poll: {e}"))?;
    if ready == 0 {
        return Err(format!("no answer from any worker in {TIMEOUT:?}"));
    }
    (0..fds.len())
        .map(|k| (from + k) % fds.len())
        .find(|&index| {
            fds[index]
                .revents()
                .is_some_and(|events| !events.is_empty())
        })
        .ok_or_else(|| "poll said ready, but no socket is".into())
}

/// The farm with `MPI_ANY_SOURCE`: one `mpirun` of `mpi/farm.c` per round.
fn mpi_farm(program: &super::mpi::Program, bytes: usize, tasks: usize) -> Result<f64, String> {
    let args = [tasks, warmup(tasks), DEPTH, bytes].map(|n| n.to_string());
    let stdout = program.run(WORKERS + 1, &args, Duration::from_secs(120))?;
    let line = super::mpi::parse_lines(&stdout, "farm")
        .into_iter()
        .next()
        .ok_or_else(|| format!("no farm line in {stdout:?}"))?;
    match line[..] {
        [workers, size, counted, elapsed_ns, ..]
            if workers == u64::from(WORKERS) && size == bytes as u64 && elapsed_ns > 0 =>
        {
            Ok(counted as f64 / (elapsed_ns as f64 / 1e9))
        }
        _ => Err(format!("a farm line that is not this run's: {line:?}")),
    }
}

/// Sleeps in `epoll` until `session` has a message from some peer, and takes it: the way an
/// event loop uses the readiness fd.
fn next_in_event_loop(session: &mut Session, epoll: &Epoll) -> Result<(u32, Vec<u8>), String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(message) = session.try_recv_any().map_err(|e| e.to_string())? {
            return Ok(message);
        }
        if Instant::now() >= deadline {
            return Err(format!("no message in {TIMEOUT:?}"));
        }
        let mut events = [EpollEvent::empty()];
        epoll
            .wait(&mut events, EpollTimeout::from(1000u16))
            .map_err(|e| format!("epoll_wait: {e}"))?;
    }
}

/// An epoll instance watching `fd` for reading.
fn epoll_on(fd: BorrowedFd<'_>) -> Result<Epoll, String> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| format!("epoll: {e}"))?;
    epoll
        .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, 0))
        .map_err(|e| format!("epoll_ctl: {e}"))?;
    Ok(epoll)
}

/// Round trips of 8 bytes where each side sleeps in `epoll_wait` on its readiness fd.
fn readiness_pingpong(socket: &Path, rounds: usize) -> Result<Vec<u64>, String> {
    let e = |e: shmbroker::Error| e.to_string();
    let total = warmup(rounds) + rounds;
    two_ranks(
        socket,
        |session| {
            let epoll = epoll_on(session.readiness_fd())?;
            for _ in 0..total {
                let (from, message) = next_in_event_loop(session, &epoll)?;
                session.send(from, &message).map_err(e)?;
            }
            Ok(())
        },
        |session| {
            let epoll = epoll_on(session.readiness_fd())?;
            let mut samples = Vec::with_capacity(rounds);
            for round in 0..total {
                let start = Instant::now();
                session.send(1, &round.to_le_bytes()).map_err(e)?;
                let (from, message) = next_in_event_loop(session, &epoll)?;
                if from != 1 || message != round.to_le_bytes() {
                    return Err(format!("round {round}: {message:?} from rank {from}"));
                }
                if round >= total - rounds {
                    samples.push(start.elapsed().as_nanos() as u64);
                }
            }
            Ok(samples)
        },
    )
}

/// The floor: two eventfds, each side sleeping in `epoll_wait` on its own, reading it and
/// writing the other's.
fn eventfd_pingpong(rounds: usize) -> Result<Vec<u64>, String> {
    let io = |e: std::io::Error| format!("eventfd: {e}");
    let (to_child, to_parent) = (
        eventfd::create().map_err(io)?,
        eventfd::create().map_err(io)?,
    );
    let total = warmup(rounds) + rounds;
    let wait = |epoll: &Epoll, own: BorrowedFd<'_>| -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        while eventfd::drain(own) == 0 {
            if Instant::now() >= deadline {
                return Err(format!("no wake-up in {TIMEOUT:?}"));
            }
            let mut events = [EpollEvent::empty()];
            epoll
                .wait(&mut events, EpollTimeout::from(1000u16))
                .map_err(|e| format!("epoll_wait: {e}"))?;
        }
        Ok(())
    };
    fork_pair(
        || {
            let epoll = epoll_on(to_child.as_fd())?;
            for _ in 0..total {
                wait(&epoll, to_child.as_fd())?;
                eventfd::signal(to_parent.as_fd());
            }
            Ok(())
        },
        || {
            let epoll = epoll_on(to_parent.as_fd())?;
            let mut samples = Vec::with_capacity(rounds);
            for round in 0..total {
                let start = Instant::now();
                eventfd::signal(to_child.as_fd());
                wait(&epoll, to_parent.as_fd())?;
                if round >= total - rounds {
                    samples.push(start.elapsed().as_nanos() as u64);
                }
            }
            Ok(samples)
        },
    )
}

/// `try_recv_any` against `try_recv` on each peer, with `peers` peers connected and sending
/// nothing, alternating in one session: nanoseconds per call, in samples of 1 000 calls.
fn try_recv_idle(
    plan: Plan<'_>,
    socket: &Path,
    peers: u32,
    calls: usize,
) -> Result<Vec<(&'static str, Measure)>, String> {
    const BATCH: usize = 1_000;
    let e = |e: shmbroker::Error| e.to_string();
    with_broker(
        socket,
        peers + 1,
        |rank| {
            // Waits for rank 0's word that it is done, then leaves.
            let mut session = connect(socket, rank, None)?;
            session.recv(0).map_err(e).map(drop)
        },
        || {
            let mut session = connect(socket, 0, None)?;
            let nothing = |got: bool| {
                if got {
                    Err("a message arrived, and no peer sends any".to_owned())
                } else {
                    Ok(())
                }
            };
            let any = |session: &mut Session| nothing(session.try_recv_any().map_err(e)?.is_some());
            let each = |session: &mut Session| {
                for peer in 1..=peers {
                    nothing(session.try_recv(peer).map_err(e)?.is_some())?;
                }
                Ok(())
            };
            let (mut ours, mut baseline) = (Vec::new(), Vec::new());
            for round in 0..plan.rounds {
                // Which goes first alternates from round to round.
                let order = if round % 2 == 0 {
                    [true, false]
                } else {
                    [false, true]
                };
                for ours_now in order {
                    if ours_now {
                        ours.push(batched(calls, BATCH, || any(&mut session))?);
                    } else {
                        baseline.push(batched(calls, BATCH, || each(&mut session))?);
                    }
                }
            }
            for peer in 1..=peers {
                session.send(peer, &[]).map_err(e)?;
            }
            Ok(vec![
                ("shmbroker try_recv_any", Measure::Latency(ours)),
                ("try_recv on each peer", Measure::Latency(baseline)),
            ])
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_or_unexpected_answer_is_refused() {
        let mut ledger = Ledger {
            outstanding: vec![VecDeque::new(); 2],
            next: 0,
            answered: 0,
        };
        let mut task = vec![0u8; 64];
        ledger.hand_out(1, &mut task);
        ledger.hand_out(1, &mut task);
        assert!(
            ledger.check(2, &answer_to(0, 64, 0), 64).is_err(),
            "rank 2 has no task"
        );
        assert!(
            ledger.check(3, &answer_to(0, 64, 0), 64).is_err(),
            "no rank 3"
        );
        assert!(
            ledger.check(1, &answer_to(0, 64, 1), 64).is_err(),
            "wrong check"
        );
        // The refused answer used up task 0; task 1 is next and answered right.
        ledger.check(1, &answer_to(1, 64, 1), 64).unwrap();
        assert_eq!(ledger.answered, 1);
    }

    #[test]
    fn workers_answer_what_the_reader_checks() {
        let mut ledger = Ledger {
            outstanding: vec![VecDeque::new()],
            next: 0,
            answered: 0,
        };
        let mut task = vec![0u8; 4096];
        ledger.hand_out(1, &mut task);
        let mut given = Some(task.clone());
        let mut answers = Vec::new();
        work_farm(
            4096,
            |buffer| {
                Ok(given.take().map(|task| {
                    buffer[..task.len()].copy_from_slice(&task);
                    task.len()
                }))
            },
            |answer| {
                answers.push(*answer);
                Ok(())
            },
        )
        .unwrap();
        ledger.check(1, &answers[0], 4096).unwrap();
        let short = work_farm(8, |buffer| Ok(Some(buffer.len() - 4)), |_| Ok(()));
        assert!(short.is_err(), "a task shorter than its id is refused");
    }
}
