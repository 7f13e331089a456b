//! `channel_stream` and `typed_farm` (in `bench farm`): typed channels against the ring under
//! them, shaq, the session's own `send`/`recv_any`, and Open MPI.
//!
//! | bench | ours | baselines |
//! |---|---|---|
//! | `channel_stream` (8 and 64 B, one at a time and in batches of 32) | a `ChannelSender<[u64; W]>` in one process, its `ChannelReceiver` in another, `try_send`/`try_recv` (or `_batch`) loops, records per second | the raw ring of `bench queue`'s `stream_*` rows, the same loops (`raw ring`); shaq 4.3's (`shaq-4.3`) |
//! | `typed_farm` (1 and 3 workers, 64 B records each way) | a scheduler with a channel to and from each worker, up to [`WINDOW`] records out per worker, answers taken in batches; each worker answers every record with one; transactions per second | the same loop over `send` and `recv_any_into` (`send/recv_any`); over Open MPI, `MPI_Send` and `MPI_Irecv` from `MPI_ANY_SOURCE` (`mpi/typed_farm.c`, `open-mpi`) |
//!
//! `channel_stream`'s typed channel and raw ring run the very same two loops
//! (`queue::produce_stream` and `queue::consume_stream`, generic over the ends), so the rows
//! differ only in the ends. Rank 0, which only waits, parks rather than spins.
//!
//! Every contender checks every record. 2 (stream) or 2 to 4 (farm) processes share the
//! machine's CPUs; every loop spins on `try_*` as `bench queue`'s streams do, so these figures
//! say what the calls cost, not how they wait.

use super::queue::{
    STREAM_WARMUP, StreamReceiver, StreamSender, consume_stream, ours_stream, produce_stream,
    shaq_stream, stream_capacity, stream_count,
};
use super::workers::{connect, open_mpi, with_broker};
use super::{Comparison, Measure, Plan, Report, Run, Size, alternate};
use bytemuck::Pod;
use shmbroker::Collectives;
use shmbroker::session::{ChannelReceiver, ChannelSender};
use shmbroker_sys::TempDir;
use std::path::Path;
use std::time::{Duration, Instant};

/// Records a farm's scheduler keeps out to each worker.
pub const WINDOW: usize = 256;

/// How long any one run may take before it fails.
const DEADLINE: Duration = Duration::from_secs(60);

/// `channel_stream` and `typed_farm`.
///
/// # Errors
///
/// A contender failing.
pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    let dir = TempDir::new("bench-channels").map_err(|e| e.to_string())?;
    let sockets = std::cell::Cell::new(0u32);
    let socket = || {
        sockets.set(sockets.get() + 1);
        dir.path().join(format!("channels-{}.sock", sockets.get()))
    };
    if plan.wants("channel_stream") {
        stream::<1>(plan, report, &socket, false)?;
        stream::<8>(plan, report, &socket, false)?;
        stream::<1>(plan, report, &socket, true)?;
        stream::<8>(plan, report, &socket, true)?;
        report.note(
            "channel_stream",
            "ours is a typed channel (a ChannelSender<[u64; W]> and its ChannelReceiver in two \
             processes), the raw ring the one under it as `bench queue` streams it, shaq 4.3 the \
             reference SPSC queue; same loops, every record checked",
        );
    }
    if plan.wants("typed_farm") {
        let mpi = open_mpi("typed_farm", super::mpi::TYPED_FARM_C);
        for workers in [1u32, 3] {
            report.progress(&format!("typed_farm, {workers} workers"));
            let count = plan.size(1_000_000, 100_000);
            let ours = || channel_farm(&socket(), workers, count);
            let session = || session_farm(&socket(), workers, count);
            let mut runs: Vec<(&'static str, Run<'_>)> =
                vec![("typed channels", &ours), ("send/recv_any", &session)];
            let open_mpi = mpi
                .as_ref()
                .map(|program| move || mpi_typed_farm(program, workers, count));
            if let Some(open_mpi) = &open_mpi {
                runs.push(("open-mpi", open_mpi));
            }
            let contenders = alternate(plan, &runs)?;
            report.add(Comparison {
                bench: "typed_farm".into(),
                size: Size::Workers(workers),
                contenders,
            });
        }
        report.note(
            "typed_farm",
            "one scheduler and 1 or 3 workers, 64-byte records each way, up to 256 out per \
             worker, transactions (answered records) per second: ours over typed channels, the \
             baselines the same loop over the session's send and recv_any_into and over Open \
             MPI's MPI_Send and MPI_Irecv from MPI_ANY_SOURCE",
        );
    }
    Ok(())
}

fn stream<const W: usize>(
    plan: Plan<'_>,
    report: &mut Report,
    socket: &dyn Fn() -> std::path::PathBuf,
    batched: bool,
) -> Result<(), String>
where
    [u64; W]: Pod,
{
    report.progress(&format!(
        "channel_stream {} bytes{}",
        8 * W,
        if batched { ", batched" } else { "" }
    ));
    let count = stream_count::<W>(plan);
    let ours = || channel_stream::<W>(&socket(), count, batched);
    let ring = || ours_stream::<W>(count, batched);
    let shaq = || shaq_stream::<W>(count, batched);
    let runs: Vec<(&'static str, Run<'_>)> = vec![
        ("typed channel", &ours),
        ("raw ring", &ring),
        ("shaq-4.3", &shaq),
    ];
    let contenders = alternate(plan, &runs)?;
    report.add(Comparison {
        bench: if batched {
            "channel_stream_batched".into()
        } else {
            "channel_stream_single".into()
        },
        size: Size::Bytes(8 * W),
        contenders,
    });
    Ok(())
}

/// Records per second through a typed channel from forked rank 1 to forked rank 2: the loops
/// of `bench queue`'s ring streams, over a channel's ends, each on a CPU of its own as theirs
/// are.
fn channel_stream<const W: usize>(
    socket: &Path,
    count: usize,
    batched: bool,
) -> Result<Measure, String>
where
    [u64; W]: Pod,
{
    let e = |e: shmbroker::Error| e.to_string();
    let total = count + STREAM_WARMUP;
    let capacity = stream_capacity::<W>();
    let cpus = super::cpu_pair();
    let rate_file = socket.with_extension("rate");
    // Both ends in forked processes, as `bench queue`'s ring streams: this one hosts the broker
    // (a thread), and only waits.
    with_broker(
        socket,
        3,
        |rank| {
            let mut session = connect(socket, rank, None)?;
            if rank == 1 {
                let mut tx = session.channel_to::<[u64; W]>(2, 1, capacity).map_err(e)?;
                // The producer on the first CPU and the consumer on the second, as `bench
                // queue`'s ring streams place theirs.
                if let Some((cpu, _)) = cpus {
                    super::pin_to(cpu);
                }
                // Both ends ready before the stream starts, as the raw ring's are.
                session.recv(2).map_err(e)?;
                produce_stream(&mut tx, total, batched)?;
            } else {
                let mut rx = session.channel_from::<[u64; W]>(1, 1).map_err(e)?;
                if let Some((_, cpu)) = cpus {
                    super::pin_to(cpu);
                }
                session.send(1, &[]).map_err(e)?;
                let rate = consume_stream(&mut rx, total, batched)?.rate(total)?;
                std::fs::write(&rate_file, rate.to_string()).map_err(|e| e.to_string())?;
            }
            // The consumer counts before anyone leaves: the channel stays open until then.
            session.barrier().map_err(e)
        },
        || {
            // Parked while it waits, so that it takes no CPU from the two ends (each has one).
            let mut session = connect(socket, 0, Some(0))?;
            session.barrier().map_err(e)?;
            let rate: f64 = std::fs::read_to_string(&rate_file)
                .map_err(|e| format!("the consumer's rate: {e}"))?
                .parse()
                .map_err(|e| format!("the consumer's rate: {e}"))?;
            Ok(Measure::Throughput(vec![rate]))
        },
    )
}

impl<M: Pod> StreamSender<M> for ChannelSender<M> {
    #[inline]
    fn put(&mut self, messages: &[M]) -> Result<usize, String> {
        match messages {
            [one] => self.try_send(one).map(usize::from),
            _ => self.try_send_batch(messages),
        }
        .map_err(|e| e.to_string())
    }
}

impl<M: Pod> StreamReceiver<M> for ChannelReceiver<M> {
    #[inline]
    fn take(&mut self, buffer: &mut [M]) -> Result<usize, String> {
        match buffer {
            [one] => self.try_recv().map(|record| {
                record.map_or(0, |record| {
                    *one = record;
                    1
                })
            }),
            _ => self.try_recv_batch(buffer),
        }
        .map_err(|e| e.to_string())
    }
}

/// A farm's record: a transaction's id and 56 bytes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Record {
    id: u64,
    body: [u64; 7],
}

impl Record {
    fn task(id: u64) -> Self {
        Self { id, body: [id; 7] }
    }

    /// A worker's answer to `self`.
    fn answer(&self) -> Self {
        Self {
            id: self.id,
            body: self.body.map(|word| word.wrapping_mul(3)),
        }
    }
}

/// What the scheduler keeps per worker: records sent, answers taken.
#[derive(Clone, Copy, Default)]
struct Books {
    sent: u64,
    answered: u64,
}

/// Transactions per second of a scheduler (this process) over `workers` forked workers, each
/// with a typed channel each way.
fn channel_farm(socket: &Path, workers: u32, count: usize) -> Result<Measure, String> {
    let e = |e: shmbroker::Error| e.to_string();
    let per_worker = (count / workers as usize) as u64;
    with_broker(
        socket,
        workers + 1,
        |rank| {
            let mut session = connect(socket, rank, None)?;
            let mut tasks = session.channel_from::<Record>(0, 2).map_err(e)?;
            let mut answers = session.channel_to::<Record>(0, 3, 1024).map_err(e)?;
            let mut batch = [Record::task(0); 64];
            let mut done = 0;
            while done < per_worker {
                let got = tasks.recv_batch(&mut batch).map_err(e)?;
                for record in &mut batch[..got] {
                    *record = record.answer();
                }
                answers.send_batch(&batch[..got]).map_err(e)?;
                done += got as u64;
            }
            session.barrier().map_err(e)
        },
        || {
            let mut session = connect(socket, 0, None)?;
            let mut tasks = Vec::new();
            let mut answers = Vec::new();
            for worker in 1..=workers {
                tasks.push(session.channel_to::<Record>(worker, 2, 1024).map_err(e)?);
                answers.push(session.channel_from::<Record>(worker, 3).map_err(e)?);
            }
            let mut books = vec![Books::default(); workers as usize];
            let mut out = [Record::task(0); 64];
            let mut got = [Record::task(0); 64];
            let warm = per_worker / 10;
            let (mut start, mut answered, deadline) = (None, 0u64, Instant::now() + DEADLINE);
            while books.iter().any(|b| b.answered < per_worker) {
                for (w, book) in books.iter_mut().enumerate() {
                    let room = (WINDOW as u64 - (book.sent - book.answered))
                        .min(per_worker - book.sent)
                        .min(out.len() as u64) as usize;
                    if room > 0 {
                        for (k, record) in out[..room].iter_mut().enumerate() {
                            *record = Record::task(book.sent + k as u64);
                        }
                        book.sent += tasks[w].try_send_batch(&out[..room]).map_err(e)? as u64;
                    }
                    let n = answers[w].try_recv_batch(&mut got).map_err(e)?;
                    for answer in &got[..n] {
                        if *answer != Record::task(book.answered).answer() {
                            return Err(format!("worker {}: a wrong answer", w + 1));
                        }
                        book.answered += 1;
                    }
                    answered += n as u64;
                }
                if start.is_none() && answered >= warm * u64::from(workers) {
                    start = Some((Instant::now(), answered));
                }
                if Instant::now() > deadline {
                    return Err("the farm did not finish".into());
                }
            }
            let (start, at) = start.ok_or("no warm-up")?;
            let rate = (answered - at) as f64 / start.elapsed().as_secs_f64().max(1e-9);
            session.barrier().map_err(e)?;
            Ok(Measure::Throughput(vec![rate]))
        },
    )
}

/// [`channel_farm`]'s loop over the session's own `send` and `recv_any_into`.
fn session_farm(socket: &Path, workers: u32, count: usize) -> Result<Measure, String> {
    let e = |e: shmbroker::Error| e.to_string();
    // Fewer: the session path is the slower, and the figure is a rate.
    let per_worker = (count / 4 / workers as usize) as u64;
    with_broker(
        socket,
        workers + 1,
        |rank| {
            let mut session = connect(socket, rank, None)?;
            let mut task = Record::task(0);
            for _ in 0..per_worker {
                let len = session
                    .recv_into(0, bytemuck::bytes_of_mut(&mut task))
                    .map_err(e)?;
                if len != size_of::<Record>() {
                    return Err(format!("a task of {len} bytes"));
                }
                session
                    .send(0, bytemuck::bytes_of(&task.answer()))
                    .map_err(e)?;
            }
            session.barrier().map_err(e)
        },
        || {
            let mut session = connect(socket, 0, None)?;
            let mut books = vec![Books::default(); workers as usize];
            let mut answer = Record::task(0);
            let warm = per_worker / 10;
            let (mut start, mut answered) = (None, 0u64);
            while books.iter().any(|b| b.answered < per_worker) {
                for (w, book) in books.iter_mut().enumerate() {
                    while book.sent - book.answered < WINDOW as u64 && book.sent < per_worker {
                        let task = Record::task(book.sent);
                        session
                            .send(w as u32 + 1, bytemuck::bytes_of(&task))
                            .map_err(e)?;
                        book.sent += 1;
                    }
                }
                let (from, len) = session
                    .recv_any_into(bytemuck::bytes_of_mut(&mut answer))
                    .map_err(e)?;
                let book = &mut books[from as usize - 1];
                if len != size_of::<Record>() || answer != Record::task(book.answered).answer() {
                    return Err(format!("worker {from}: a wrong answer"));
                }
                book.answered += 1;
                answered += 1;
                if start.is_none() && answered >= warm * u64::from(workers) {
                    start = Some((Instant::now(), answered));
                }
            }
            let (start, at) = start.ok_or("no warm-up")?;
            let rate = (answered - at) as f64 / start.elapsed().as_secs_f64().max(1e-9);
            session.barrier().map_err(e)?;
            Ok(Measure::Throughput(vec![rate]))
        },
    )
}

/// Open MPI's farm (`mpi/typed_farm.c`), transactions per second.
fn mpi_typed_farm(
    program: &super::mpi::Program,
    workers: u32,
    count: usize,
) -> Result<Measure, String> {
    let per_worker = count / 4 / workers as usize;
    let args = [per_worker, WINDOW].map(|n| n.to_string());
    let stdout = program.run(workers + 1, &args, Duration::from_secs(120))?;
    let line = super::mpi::parse_lines(&stdout, "typed_farm")
        .into_iter()
        .next()
        .ok_or_else(|| format!("no typed_farm line in {stdout:?}"))?;
    match line.as_slice() {
        [transactions, nanos] => Ok(Measure::Throughput(vec![
            *transactions as f64 * 1e9 / (*nanos).max(1) as f64,
        ])),
        _ => Err(format!("a typed_farm line of {} numbers", line.len())),
    }
}
