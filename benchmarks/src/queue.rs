//! `bench queue`: the ring against shaq 4.3 and the physical floors.
//!
//! | bench | ours | baselines |
//! |---|---|---|
//! | `pingpong_hot` | `send_timeout`/`recv_timeout` spinning (spin limit `u32::MAX`) | shaq `try_write`/`try_read` spin loop; a request line and an answer line (the floor for any pair of rings); one cache line bounced both ways (the physical floor) |
//! | `pingpong_parked` | `recv_timeout` with spin limit 0 (always parks) | a raw futex ping-pong on two shared words; shaq `read_timeout` (which spins 2048 times first) |
//! | `stream_single` | `try_send` / `try_recv` loops | shaq `try_write` / `try_read` loops |
//! | `stream_batched` | `try_send_batch` / `try_recv_batch` of 32 | shaq `write_batch` / `try_reserve_read_batch` of 32 |
//! | `stream_*` at 4096 bytes | as above | also `memcpy` of 4096-byte blocks on one core |
//!
//! Every side runs in its own process (fork), pinned to its own CPU when two are available.
//! `pingpong_hot` runs once per placement the topology offers: on two separate cores, and as
//! `pingpong_hot_siblings` on two hyperthreads of one core (a line moves several times faster
//! between those), with a note naming the CPUs. A virtual machine may show no siblings while its
//! host places both vCPUs on one core, and may move them between runs: on the 2-vCPU machines
//! this was measured on, `pingpong_hot` lands at about 500 ns or about 150 ns depending on the
//! run, ours staying at 1.0-1.3x the one-line-per-direction floor in both.
//! Both consumers copy every message out of the ring into a private buffer: ours always does
//! (it never hands out references into memory a peer can write), so shaq's does too.
//! Streaming is timed by the consumer from the first message to the last, and every streamed
//! message is checked, so a benchmark that lost or reordered data fails instead of reporting.

use super::{Comparison, Measure, Plan, Report, Run, Size, alternate, fork_pair};
use bytemuck::Pod;
use shmbroker::queues::Waiting;
use shmbroker::queues::memfd::{Mapping, create_sealed};
use shmbroker::queues::{Consumer, Producer, TryRecvError, TrySendError, create};
use shmbroker::sys::futex;
use std::cell::Cell;
use std::fs::File;
use std::hint::spin_loop;
use std::io::{PipeReader, PipeWriter, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long either side of a measurement waits for the other before failing.
const PARTNER_TIMEOUT: Duration = Duration::from_secs(20);
/// Messages to stream before timing starts.
pub(super) const STREAM_WARMUP: usize = 10_000;
pub(super) const BATCH: usize = 32;
const OURS: &str = "shmbroker";
const SHAQ: &str = "shaq-4.3";

pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    pingpong_hot(plan, report)?;
    pingpong_parked(plan, report)?;
    for batched in [false, true] {
        stream::<1>(plan, report, batched)?;
        stream::<8>(plan, report, batched)?;
        stream::<512>(plan, report, batched)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Ping-pong

fn pingpong_hot(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    if !plan.wants("pingpong_hot") {
        return Ok(());
    }
    let samples = plan.size(20_000, 2_000);
    let measure = |report: &mut Report, bench: &str| -> Result<(), String> {
        report.progress(bench);
        let contenders = alternate(
            plan,
            &[
                (OURS, &|| ours_pingpong(samples, u32::MAX)),
                (SHAQ, &|| shaq_pingpong(samples, false)),
                ("floor: one line per direction", &|| {
                    two_line_pingpong(samples)
                }),
                ("floor: one cache line bounced", &|| {
                    cacheline_pingpong(samples)
                }),
            ],
        )?;
        report.add(Comparison {
            bench: bench.into(),
            size: Size::Bytes(8),
            contenders,
        });
        Ok(())
    };
    let placements = super::placements("pingpong_hot", "pingpong_hot_siblings");
    if placements.is_empty() {
        measure(report, "pingpong_hot")?;
        report.note("pingpong_hot", "one CPU: both sides share it");
    }
    for placement in placements {
        super::on_cpus(placement.cpus, || measure(report, placement.bench))?;
        report.note(placement.bench, &placement.what);
    }
    Ok(())
}

fn pingpong_parked(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    if !plan.wants("pingpong_parked") {
        return Ok(());
    }
    report.progress("pingpong_parked");
    let samples = plan.size(3_000, 300);
    let contenders = alternate(
        plan,
        &[
            (OURS, &|| ours_pingpong(samples, 0)),
            ("raw futex ping-pong", &|| futex_pingpong(samples)),
            ("shaq-4.3 (spins 2048, then parks)", &|| {
                shaq_pingpong(samples, true)
            }),
        ],
    )?;
    report.add(Comparison {
        bench: "pingpong_parked".into(),
        size: Size::Bytes(8),
        contenders,
    });
    Ok(())
}

fn warmup(samples: usize) -> usize {
    samples / 10 + 100
}

fn ring_err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn ours_pingpong(samples: usize, spin_limit: u32) -> Result<Measure, String> {
    ring_pingpong::<u64>(samples, spin_limit, |i| i, |value| *value)
}

/// Round trips (nanoseconds) over the rings a session sends on: one 64-byte `Message` slot each
/// way, spinning, after warm-up.
pub(super) fn message_pingpong(samples: usize) -> Result<Vec<u64>, String> {
    use shmbroker::bindings::Message;
    let make = |i: u64| Message {
        tag: i,
        ..bytemuck::Zeroable::zeroed()
    };
    match ring_pingpong::<Message>(samples, u32::MAX, make, |message| message.tag)? {
        Measure::Latency(rounds) => Ok(rounds.concat()),
        Measure::Throughput(_) => Err("a ping-pong measures latency".into()),
    }
}

/// Ping-pong over two rings of `T`: the parent sends `make(i)`, the child answers with
/// `make(read(value) + 1)`.
fn ring_pingpong<T: Pod>(
    samples: usize,
    spin_limit: u32,
    make: impl Fn(u64) -> T,
    read: impl Fn(&T) -> u64,
) -> Result<Measure, String> {
    let there = create::<T>(1024).map_err(ring_err)?;
    let back = create::<T>(1024).map_err(ring_err)?;
    let total = warmup(samples) + samples;
    fork_pair(
        || {
            let mut rx = Consumer::<T>::join(there.as_fd()).map_err(ring_err)?;
            let mut tx = Producer::<T>::join(back.as_fd()).map_err(ring_err)?;
            rx.set_waiting(Waiting::Spin(spin_limit));
            tx.set_waiting(Waiting::Spin(spin_limit));
            for _ in 0..total {
                let value = rx.recv_timeout(PARTNER_TIMEOUT).map_err(ring_err)?;
                tx.send_timeout(make(read(&value) + 1), PARTNER_TIMEOUT)
                    .map_err(ring_err)?;
            }
            Ok(())
        },
        || {
            let mut tx = Producer::<T>::join(there.as_fd()).map_err(ring_err)?;
            let mut rx = Consumer::<T>::join(back.as_fd()).map_err(ring_err)?;
            tx.set_waiting(Waiting::Spin(spin_limit));
            rx.set_waiting(Waiting::Spin(spin_limit));
            let mut times = Vec::with_capacity(total);
            for i in 0..total as u64 {
                let start = Instant::now();
                tx.send_timeout(make(i), PARTNER_TIMEOUT)
                    .map_err(ring_err)?;
                let answer = read(&rx.recv_timeout(PARTNER_TIMEOUT).map_err(ring_err)?);
                times.push(start.elapsed().as_nanos() as u64);
                if answer != i + 1 {
                    return Err(format!("ping {i} answered with {answer}"));
                }
            }
            Ok(Measure::latency(times.split_off(warmup(samples))))
        },
    )
}

/// A plain (unsealed) memfd for shaq, which sizes the file itself.
fn shaq_file() -> Result<File, String> {
    let fd = shmbroker::queues::memfd::create_unsealed(c"shaq-bench").map_err(|e| e.to_string())?;
    Ok(File::from(fd))
}

fn shaq_file_size<T>(capacity: usize) -> usize {
    shaq::spsc::minimum_file_size::<T>(capacity).next_multiple_of(4096)
}

/// Creates a shaq SPSC queue of `T` in a fresh memfd, as its producer.
fn shaq_create<T: Pod>(capacity: usize) -> Result<(File, shaq::spsc::Producer<T>), String> {
    let file = shaq_file()?;
    // SAFETY: the file was created just now and this is its sole initializer; `T` is `Pod`, so
    // any bytes are a valid value; the one consumer is joined (with the same `T`) by the caller.
    let producer =
        unsafe { shaq::spsc::Producer::<T>::create(&file, shaq_file_size::<T>(capacity)) }
            .map_err(|e| format!("shaq create: {e:?}"))?;
    Ok((file, producer))
}

fn shaq_join_consumer<T: Pod>(file: &File) -> Result<shaq::spsc::Consumer<T>, String> {
    // SAFETY: the queue was created with the same `T` by `shaq_create`, and this is its only
    // consumer.
    unsafe { shaq::spsc::Consumer::<T>::join(file) }.map_err(|e| format!("shaq join: {e:?}"))
}

fn shaq_join_producer<T: Pod>(file: &File) -> Result<shaq::spsc::Producer<T>, String> {
    // SAFETY: as in `shaq_join_consumer`, for the only producer.
    unsafe { shaq::spsc::Producer::<T>::join(file) }.map_err(|e| format!("shaq join: {e:?}"))
}

/// Receives one value from shaq: spinning with `try_read`, or with `read_timeout` when `parked`.
fn shaq_recv<T>(rx: &mut shaq::spsc::Consumer<T>, parked: bool) -> Result<T, String> {
    if parked {
        return rx
            .read_timeout(PARTNER_TIMEOUT)
            .map_err(|e| format!("shaq read: {e:?}"));
    }
    let (deadline, mut spins) = (partner_deadline(), 0);
    loop {
        if let Some(value) = rx.try_read() {
            return Ok(value);
        }
        spin_loop();
        check_deadline(deadline, &mut spins)?;
    }
}

fn shaq_pingpong(samples: usize, parked: bool) -> Result<Measure, String> {
    // Both queues are created here; each process then joins the ends it uses.
    let (there, there_tx) = shaq_create::<u64>(1024)?;
    let (back, back_tx) = shaq_create::<u64>(1024)?;
    drop((there_tx, back_tx));
    let total = warmup(samples) + samples;
    fork_pair(
        || {
            let mut rx = shaq_join_consumer::<u64>(&there)?;
            let mut tx = shaq_join_producer::<u64>(&back)?;
            for _ in 0..total {
                let value = shaq_recv(&mut rx, parked)?;
                tx.try_write(value + 1).map_err(|_| "shaq: full")?;
            }
            Ok(())
        },
        || {
            let mut tx = shaq_join_producer::<u64>(&there)?;
            let mut rx = shaq_join_consumer::<u64>(&back)?;
            let mut times = Vec::with_capacity(total);
            for i in 0..total as u64 {
                let start = Instant::now();
                tx.try_write(i).map_err(|_| "shaq: full")?;
                let answer = shaq_recv(&mut rx, parked)?;
                times.push(start.elapsed().as_nanos() as u64);
                if answer != i + 1 {
                    return Err(format!("ping {i} answered with {answer}"));
                }
            }
            Ok(Measure::latency(times.split_off(warmup(samples))))
        },
    )
}

/// A sealed shared page for the floor measurements: plain atomics, no protocol.
struct SharedPage {
    mapping: Mapping,
    _fd: OwnedFd,
}

impl SharedPage {
    fn new() -> Result<Self, String> {
        let fd = create_sealed(c"shmbroker-bench", 4096).map_err(ring_err)?;
        let mapping = Mapping::map(&fd, 4096).map_err(ring_err)?;
        Ok(Self { mapping, _fd: fd })
    }

    /// The `u64` at byte `128 * line` (each on its own pair of cache lines).
    fn word64(&self, line: usize) -> &AtomicU64 {
        assert!(line < 32);
        // SAFETY: the mapping is 4096 bytes, page-aligned and lives as long as `self`; offset
        // `128 * line + 8 <= 4096`, and an `AtomicU64` may alias shared memory.
        unsafe { self.mapping.at(128 * line).cast::<AtomicU64>().as_ref() }
    }

    fn word32(&self, line: usize) -> &AtomicU32 {
        assert!(line < 32);
        // SAFETY: as in `word64`, for 4 bytes.
        unsafe { self.mapping.at(128 * line).cast::<AtomicU32>().as_ref() }
    }
}

/// Spins until `word` holds `target`, failing if the partner stays silent past its deadline.
fn await_value(word: &AtomicU64, target: u64) -> Result<(), String> {
    let (deadline, mut spins) = (partner_deadline(), 0);
    while word.load(Ordering::Acquire) != target {
        spin_loop();
        check_deadline(deadline, &mut spins)?;
    }
    Ok(())
}

/// One line floor: a single cache line, written by each side in turn (two line transfers per
/// round trip, and the writer always finds the line shared, never elsewhere modified).
fn cacheline_pingpong(samples: usize) -> Result<Measure, String> {
    let page = SharedPage::new()?;
    line_pingpong(samples, page.word64(0), page.word64(0))
}

/// Two-line floor: the request on one line, the answer on another, as any pair of rings (one per
/// direction) must do. No ring protocol can beat this; ours is measured against it.
fn two_line_pingpong(samples: usize) -> Result<Measure, String> {
    let page = SharedPage::new()?;
    line_pingpong(samples, page.word64(0), page.word64(4))
}

/// The parent stores odd numbers to `ping`, the child answers with the next even one on `pong`.
fn line_pingpong(samples: usize, ping: &AtomicU64, pong: &AtomicU64) -> Result<Measure, String> {
    let total = (warmup(samples) + samples) as u64;
    fork_pair(
        || {
            for i in 0..total {
                await_value(ping, 2 * i + 1)?;
                pong.store(2 * i + 2, Ordering::Release);
            }
            Ok(())
        },
        || {
            let mut times = Vec::with_capacity(total as usize);
            for i in 0..total {
                let start = Instant::now();
                ping.store(2 * i + 1, Ordering::Release);
                await_value(pong, 2 * i + 2)?;
                times.push(start.elapsed().as_nanos() as u64);
            }
            Ok(Measure::latency(times.split_off(warmup(samples))))
        },
    )
}

/// The parked floor: each side stores the next value, always calls FUTEX_WAKE, then sleeps in
/// FUTEX_WAIT until its own word changes.
fn futex_pingpong(samples: usize) -> Result<Measure, String> {
    let page = SharedPage::new()?;
    let (ping, pong) = (page.word32(0), page.word32(1));
    let total = (warmup(samples) + samples) as u32;
    let send = |word: &AtomicU32, value: u32| {
        word.store(value, Ordering::Release);
        futex::wake(word, 1);
    };
    let await_value = |word: &AtomicU32, target: u32| -> Result<(), String> {
        let deadline = Instant::now() + PARTNER_TIMEOUT;
        let slice = Duration::from_millis(100);
        loop {
            let now = word.load(Ordering::Acquire);
            if now == target {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("futex: partner silent".into());
            }
            futex::wait(word, now, Some(slice));
        }
    };
    fork_pair(
        || {
            for i in 1..=total {
                await_value(ping, i)?;
                send(pong, i);
            }
            Ok(())
        },
        || {
            let mut times = Vec::with_capacity(total as usize);
            for i in 1..=total {
                let start = Instant::now();
                send(ping, i);
                await_value(pong, i)?;
                times.push(start.elapsed().as_nanos() as u64);
            }
            Ok(Measure::latency(times.split_off(warmup(samples))))
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Streaming

/// Capacity in messages for a ring of `[u64; W]`: about 1 MiB of slots, at most 1024.
pub(super) fn stream_capacity<const W: usize>() -> usize {
    (1 << 20) / (8 * W + 8).next_power_of_two()
}

pub(super) fn stream_count<const W: usize>(plan: Plan<'_>) -> usize {
    match W {
        512 => plan.size(200_000, 20_000),
        _ => plan.size(2_000_000, 100_000),
    }
}

fn stream<const W: usize>(
    plan: Plan<'_>,
    report: &mut Report,
    batched: bool,
) -> Result<(), String> {
    let bench = if batched {
        "stream_batched"
    } else {
        "stream_single"
    };
    if !plan.wants(bench) {
        return Ok(());
    }
    report.progress(&format!("{bench} {} bytes", 8 * W));
    let count = stream_count::<W>(plan);
    let ours = || ours_stream::<W>(count, batched);
    let shaq = || shaq_stream::<W>(count, batched);
    let copy = || memcpy_stream::<W>(count);
    let mut contenders: Vec<(&'static str, Run<'_>)> = vec![(OURS, &ours), (SHAQ, &shaq)];
    if W * 8 >= 4096 {
        contenders.push(("memcpy, one core, ring-sized buffers", &copy));
    }
    let contenders = alternate(plan, &contenders)?;
    report.add(Comparison {
        bench: bench.into(),
        size: Size::Bytes(8 * W),
        contenders,
    });
    Ok(())
}

/// A pipe on which the consumer reports its timing. Only one of the two forked closures uses each
/// end; the `Cell`s let both capture them.
type TimingPipe = (Cell<Option<PipeReader>>, Cell<Option<PipeWriter>>);

fn timing_pipe() -> Result<TimingPipe, String> {
    let (reader, writer) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
    Ok((Cell::new(Some(reader)), Cell::new(Some(writer))))
}

/// What a streaming consumer reports: messages timed and the nanoseconds they took.
fn report_rate(mut pipe: PipeWriter, messages: usize, start: Instant) -> Result<(), String> {
    let nanos = start.elapsed().as_nanos() as u64;
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&(messages as u64).to_le_bytes());
    bytes[8..].copy_from_slice(&nanos.to_le_bytes());
    pipe.write_all(&bytes)
        .map_err(|e| format!("reporting: {e}"))
}

fn read_rate(mut pipe: PipeReader) -> Result<Measure, String> {
    let mut bytes = [0u8; 16];
    pipe.read_exact(&mut bytes)
        .map_err(|e| format!("reading the consumer's timing: {e}"))?;
    let messages = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default()) as f64;
    let nanos = u64::from_le_bytes(bytes[8..].try_into().unwrap_or_default()).max(1) as f64;
    Ok(Measure::Throughput(vec![messages * 1e9 / nanos]))
}

/// Checks the streamed sequence numbers and starts the clock after the warm-up.
pub(super) struct StreamCheck {
    next: u64,
    start: Option<Instant>,
}

impl StreamCheck {
    fn new() -> Self {
        Self {
            next: 0,
            start: None,
        }
    }

    fn saw(&mut self, first_word: u64) -> Result<(), String> {
        if first_word != self.next {
            return Err(format!("expected message {}, got {first_word}", self.next));
        }
        self.next += 1;
        if self.next == STREAM_WARMUP as u64 {
            self.start = Some(Instant::now());
        }
        Ok(())
    }

    fn finish(self, pipe: PipeWriter, total: usize) -> Result<(), String> {
        let start = self.start.ok_or("stream shorter than its warm-up")?;
        report_rate(pipe, total - STREAM_WARMUP, start)
    }

    /// Messages a second after the warm-up, of a stream of `total`.
    pub(super) fn rate(&self, total: usize) -> Result<f64, String> {
        let start = self.start.ok_or("stream shorter than its warm-up")?;
        Ok((total - STREAM_WARMUP) as f64 / start.elapsed().as_secs_f64().max(1e-9))
    }
}

fn partner_deadline() -> Instant {
    Instant::now() + PARTNER_TIMEOUT
}

fn check_deadline(deadline: Instant, spins: &mut u32) -> Result<(), String> {
    *spins = spins.wrapping_add(1);
    if spins.is_multiple_of(4096) && Instant::now() > deadline {
        return Err("partner silent".into());
    }
    Ok(())
}

/// The sending end of a stream that [`produce_stream`] drives: a ring's, or a typed channel's
/// (`bench farm`'s `channel_stream`), so that both run the very same loop.
pub(super) trait StreamSender<M> {
    /// Sends what of `messages` fits now (one: `try_send`; more: `try_send_batch`); how many.
    fn put(&mut self, messages: &[M]) -> Result<usize, String>;
}

/// The receiving end of a stream that [`consume_stream`] drives.
pub(super) trait StreamReceiver<M> {
    /// Takes what has arrived into `buffer` (one: `try_recv`; more: `try_recv_batch`); how many.
    fn take(&mut self, buffer: &mut [M]) -> Result<usize, String>;
}

impl<M: Pod> StreamSender<M> for Producer<M> {
    #[inline]
    fn put(&mut self, messages: &[M]) -> Result<usize, String> {
        let outcome = match messages {
            [one] => self.try_send(*one).map(|()| 1).map_err(|e| match e {
                TrySendError::Full(_) => TrySendError::Full(()),
                TrySendError::Disconnected(_) => TrySendError::Disconnected(()),
                TrySendError::Corrupted(_, c) => TrySendError::Corrupted((), c),
            }),
            _ => self.try_send_batch(messages),
        };
        match outcome {
            Ok(sent) => Ok(sent),
            Err(TrySendError::Full(())) => Ok(0),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl<M: Pod> StreamReceiver<M> for Consumer<M> {
    #[inline]
    fn take(&mut self, buffer: &mut [M]) -> Result<usize, String> {
        let received = match buffer {
            [one] => self.try_recv().map(|m| {
                *one = m;
                1
            }),
            _ => self.try_recv_batch(buffer),
        };
        match received {
            Ok(n) => Ok(n),
            Err(TryRecvError::Empty) => Ok(0),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Sends messages numbered 0 to `total - 1` through `tx`, one at a time or in batches of
/// [`BATCH`], spinning while it is full.
pub(super) fn produce_stream<const W: usize>(
    tx: &mut impl StreamSender<[u64; W]>,
    total: usize,
    batched: bool,
) -> Result<(), String>
where
    [u64; W]: Pod,
{
    let mut chunk = vec![[0u64; W]; if batched { BATCH } else { 1 }];
    let (deadline, mut spins) = (partner_deadline(), 0);
    let mut sent = 0;
    while sent < total {
        let n = chunk.len().min(total - sent);
        for (i, message) in chunk[..n].iter_mut().enumerate() {
            message[0] = (sent + i) as u64;
        }
        match tx.put(&chunk[..n])? {
            0 => {
                spin_loop();
                check_deadline(deadline, &mut spins)?;
            }
            went => sent += went,
        }
    }
    Ok(())
}

/// Takes `total` messages from `rx` into a private buffer, checking each; its timing.
pub(super) fn consume_stream<const W: usize>(
    rx: &mut impl StreamReceiver<[u64; W]>,
    total: usize,
    batched: bool,
) -> Result<StreamCheck, String>
where
    [u64; W]: Pod,
{
    let mut check = StreamCheck::new();
    let mut buffer = vec![[0u64; W]; if batched { BATCH } else { 1 }];
    let (deadline, mut spins) = (partner_deadline(), 0);
    while (check.next as usize) < total {
        match rx.take(&mut buffer)? {
            0 => {
                spin_loop();
                check_deadline(deadline, &mut spins)?;
            }
            n => buffer[..n].iter().try_for_each(|m| check.saw(m[0]))?,
        }
    }
    Ok(check)
}

pub(super) fn ours_stream<const W: usize>(count: usize, batched: bool) -> Result<Measure, String>
where
    [u64; W]: Pod,
{
    let total = count + STREAM_WARMUP;
    let ring = create::<[u64; W]>(stream_capacity::<W>()).map_err(ring_err)?;
    let (reader, writer) = timing_pipe()?;
    fork_pair(
        || {
            drop(reader.take());
            let mut rx = Consumer::<[u64; W]>::join(ring.as_fd()).map_err(ring_err)?;
            let check = consume_stream(&mut rx, total, batched)?;
            check.finish(writer.take().ok_or("pipe taken twice")?, total)
        },
        || {
            let mut tx = Producer::<[u64; W]>::join(ring.as_fd()).map_err(ring_err)?;
            produce_stream(&mut tx, total, batched)?;
            drop(writer.take());
            read_rate(reader.take().ok_or("pipe taken twice")?)
        },
    )
}

pub(super) fn shaq_stream<const W: usize>(count: usize, batched: bool) -> Result<Measure, String>
where
    [u64; W]: Pod,
{
    let total = count + STREAM_WARMUP;
    let (file, producer) = shaq_create::<[u64; W]>(stream_capacity::<W>())?;
    drop(producer);
    let (reader, writer) = timing_pipe()?;
    fork_pair(
        || {
            drop(reader.take());
            let mut rx = shaq_join_consumer::<[u64; W]>(&file)?;
            let mut check = StreamCheck::new();
            let (deadline, mut spins) = (partner_deadline(), 0);
            let max = std::num::NonZeroUsize::new(BATCH).ok_or("batch of 0")?;
            // Copy every message out, as ours does, so both consumers do the same work. On the
            // heap: at 4096-byte messages the buffer is 128 KiB.
            #[allow(clippy::useless_vec)]
            let mut buffer = vec![[0u64; W]; BATCH];
            while (check.next as usize) < total {
                let mut received = 0;
                if batched {
                    if let Some(batch) = rx.try_reserve_read_batch(max) {
                        for (slot, message) in buffer.iter_mut().zip(batch.iter()) {
                            *slot = *message;
                            received += 1;
                        }
                    }
                } else if let Some(message) = rx.try_read() {
                    buffer[0] = message;
                    received = 1;
                }
                if received == 0 {
                    spin_loop();
                    check_deadline(deadline, &mut spins)?;
                }
                buffer[..received]
                    .iter()
                    .try_for_each(|m| check.saw(m[0]))?;
            }
            check.finish(writer.take().ok_or("pipe taken twice")?, total)
        },
        || {
            let mut tx = shaq_join_producer::<[u64; W]>(&file)?;
            let mut message = [0u64; W];
            let (deadline, mut spins) = (partner_deadline(), 0);
            let mut sent = 0;
            while sent < total {
                let before = sent;
                if batched {
                    let mut batch = tx.write_batch();
                    while sent < total && sent - before < BATCH {
                        message[0] = sent as u64;
                        if batch.try_write(message).is_err() {
                            break;
                        }
                        sent += 1;
                    }
                } else {
                    message[0] = sent as u64;
                    if tx.try_write(message).is_ok() {
                        sent += 1;
                    }
                }
                if sent == before {
                    spin_loop();
                    check_deadline(deadline, &mut spins)?;
                }
            }
            drop(writer.take());
            read_rate(reader.take().ok_or("pipe taken twice")?)
        },
    )
}

/// The bandwidth baseline: one core copying the same bytes the ring moves, block by block, from a
/// buffer as large as the ring into another as large (the ring's working set, without a second
/// core or any protocol).
fn memcpy_stream<const W: usize>(count: usize) -> Result<Measure, String> {
    let blocks = stream_capacity::<W>();
    let source = vec![[7u64; W]; blocks];
    let mut destination = vec![[0u64; W]; blocks];
    let start = Instant::now();
    for i in 0..count {
        let block = i % blocks;
        destination[block].copy_from_slice(std::hint::black_box(&source[block]));
        std::hint::black_box(&mut destination[block]);
    }
    let nanos = start.elapsed().as_nanos().max(1) as f64;
    Ok(Measure::Throughput(vec![count as f64 * 1e9 / nanos]))
}
