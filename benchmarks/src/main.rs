//! `bench`: measurements that always run ours and a baseline alternately in one run.
//!
//! Each suite runs its contenders in rounds, rotating their order every round so that neither
//! drift nor warm-up favours one of them, and reports ours, each baseline and the ratio
//! ours/baseline (p50 and p99 for latency, the median over rounds for throughput). There are no
//! timing assertions anywhere: these machines are shared and noisy, so read medians and ratios.
//!
//! `cargo run --release -p shmbroker-benchmarks -- [SUITE] [--quick] [--json] [--out DIR]`; see
//! `--help`, and docs/guide's "Benchmarks".

mod bulk;
mod capi;
mod channels;
mod collectives;
mod farm;
mod logon;
mod mpi;
mod nodes;
mod queue;
mod reductions;
mod response;
mod results;
mod workers;

use clap::{Parser, Subcommand};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use std::io::Write;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Measure shmbroker and its baselines (Open MPI, shaq, UNIX sockets, futexes, its C ABI)
/// alternately in one run.
#[derive(Debug, Parser)]
#[command(name = "bench", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(flatten)]
    args: Args,
    #[command(subcommand)]
    helper: Option<Helper>,
}

/// The processes the benchmarks start from this executable.
#[derive(Debug, Subcommand)]
enum Helper {
    /// `shmbroker run`: the launcher the C ABI's all-gather and its Rust twin run under.
    #[command(hide = true)]
    Run(shmbroker_cli::run::Args),
    /// One rank of `bench collectives`' capi_all_gather, capi_all_reduce or capi_recv_any, in
    /// Rust.
    #[command(hide = true)]
    CapiRank(capi::RankArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.helper {
        Some(Helper::Run(args)) => shmbroker_cli::execute(
            shmbroker_cli::Command::Run(args),
            shmbroker_cli::logging::Format::Text,
        ),
        Some(Helper::CapiRank(args)) => shmbroker_cli::run_tool("bench", || capi::rank(&args)),
        None => shmbroker_cli::run_tool("bench", || run(&cli.args)),
    }
}

/// What to measure, and where the results go.
#[derive(Debug, clap::Args)]
struct Args {
    /// The suite to run; every suite, and a results folder, when left out.
    #[arg(value_enum)]
    suite: Option<Suite>,
    /// One JSON object per line on standard output instead of the table.
    #[arg(long)]
    json: bool,
    /// Fewer samples and sizes: a smoke run, not figures to quote.
    #[arg(long)]
    quick: bool,
    /// Rounds per bench, alternating the contenders' order each round (default 5, 1 with
    /// --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    rounds: Option<u64>,
    /// Run only the benches whose name contains NAME.
    #[arg(long, value_name = "NAME")]
    only: Option<String>,
    /// Write results.jsonl, results.md and SVG plots into DIR (default bench-results/ when every
    /// suite runs).
    #[arg(long, value_name = "DIR")]
    out: Option<String>,
}

/// The suites.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Suite {
    /// Ring latency (ping-pong, hot and parked, per CPU placement) and throughput (8, 64 and
    /// 4096-byte messages, single and batched) against shaq 4.3, one cache line bounced between
    /// two processes, a raw futex ping-pong and memcpy (pingpong_hot, pingpong_parked,
    /// stream_single, stream_batched).
    Queue,
    /// Time for 1 to 16 workers to log on, per worker, against the floor: a bare connect and
    /// accept, one SCM_RIGHTS message with as many fds, and memfd create, seal and mmap.
    Logon,
    /// Barriers, send/recv, all-gathers, reductions, fd exchange and kill -9 detection against
    /// MPI_Barrier, the raw ring, usleep-polling and futex barriers, a star relay over UNIX
    /// sockets, Open MPI's all-reduce, reduce-scatter and all-to-all, raw pidfd_getfd and
    /// SCM_RIGHTS; the C ABI's all-gather, all-reduce and recv_any against the Rust calls
    /// (barrier, sendrecv_pingpong, barrier_hot, barrier_parked, all_gather, all_reduce,
    /// reduce_scatter, all_to_all, reduce_kernel, capi_all_gather, capi_all_reduce,
    /// capi_recv_any, fd_exchange, dead_peer); torch.distributed on 2 nodes of 2 ranks made
    /// on this machine, the shmbroker backend against flat gloo and gloo's leader step
    /// (torch_nodes_*, when SHMBROKER_BENCH_PYTHON can import torch).
    Collectives,
    /// Large messages between two processes, 4 KiB to 64 MiB, with send/recv and with loans,
    /// against a UNIX socket and Open MPI; the loan hand-off; outbox allocation against
    /// rts-alloc (bulk_pingpong, bulk_throughput, loan_handoff, outbox_alloc).
    Bulk,
    /// A task farm, 1 reader and 3 workers, 64 B to 64 KiB tasks: `recv_any` against
    /// `MPI_ANY_SOURCE` and `poll` over UNIX sockets; an epoll waiter woken through the
    /// readiness fd against a raw eventfd ping-pong; `try_recv_any` with 8 idle peers against
    /// `try_recv` on each; the MindIE loop (1 MiB broadcasts, one worker 20 ms slow) from C
    /// and from Python, its fast replies' wait against the same loop paced so that no
    /// broadcast waits; typed channels against the raw ring and shaq, and a scheduler farm over
    /// them against send/recv_any and Open MPI (farm, readiness_wake, try_recv_any_idle,
    /// response_wait_c, response_wait_python, channel_stream_single, channel_stream_batched,
    /// typed_farm).
    Farm,
    /// Every suite, then a results folder.
    All,
}

/// How long any one measured child process may run before it is killed.
const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// Run-size knobs shared by every suite.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan<'a> {
    pub rounds: usize,
    pub quick: bool,
    /// Run only the benches whose name contains this.
    pub only: Option<&'a str>,
}

impl Plan<'_> {
    /// Whether the bench called `name` is to run.
    pub fn wants(&self, name: &str) -> bool {
        self.only.is_none_or(|only| name.contains(only))
    }

    /// `full` normally, `quick` under `--quick`.
    pub fn size(&self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let rounds = args
        .rounds
        .map_or(if args.quick { 1 } else { 5 }, |n| n as usize);
    let plan = Plan {
        rounds,
        quick: args.quick,
        only: args.only.as_deref(),
    };
    // Before anything is written: the results folder may be inside the checkout.
    let commit = results::source_commit();
    let mut report = Report::new(args.json);
    let mut out = args.out.clone();
    match args.suite.unwrap_or(Suite::All) {
        Suite::Queue => queue::run(plan, &mut report)?,
        Suite::Logon => logon::run(plan, &mut report)?,
        Suite::Collectives => {
            collectives::run(plan, &mut report)?;
            nodes::run(plan, &mut report)?;
        }
        Suite::Bulk => bulk::run(plan, &mut report)?,
        Suite::Farm => {
            farm::run(plan, &mut report)?;
            response::run(plan, &mut report)?;
            channels::run(plan, &mut report)?;
        }
        // Every suite, the queue first: it forks, and no thread may exist yet.
        Suite::All => {
            queue::run(plan, &mut report)?;
            logon::run(plan, &mut report)?;
            collectives::run(plan, &mut report)?;
            nodes::run(plan, &mut report)?;
            bulk::run(plan, &mut report)?;
            farm::run(plan, &mut report)?;
            response::run(plan, &mut report)?;
            channels::run(plan, &mut report)?;
            out.get_or_insert_with(|| "bench-results".into());
        }
    }
    let (comparisons, notes) = report.finish();
    if let Some(dir) = out {
        let run = results::RunInfo {
            commit,
            quick: args.quick,
            rounds,
            only: args.only.clone(),
        };
        let written = results::write(std::path::Path::new(&dir), &run, &comparisons, &notes)?;
        eprintln!("results written: {}", written.join(", "));
    }
    Ok(())
}

/// What one contender measured in one benchmark.
#[derive(Clone, Debug)]
pub(crate) enum Measure {
    /// Round-trip times in nanoseconds, one list per round (pooled for p50 and p99; each
    /// round's own p50 gives the spread).
    Latency(Vec<Vec<u64>>),
    /// Messages per second, one figure per round.
    Throughput(Vec<f64>),
}

impl Measure {
    /// One round's latencies.
    pub fn latency(samples: Vec<u64>) -> Self {
        Self::Latency(vec![samples])
    }
}

/// What a benchmark's size column means.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Size {
    /// Bytes per message.
    Bytes(usize),
    /// Workers logging on, or taking part.
    Workers(u32),
    /// Peers of the measuring rank.
    Peers(u32),
    /// Tasks of `bytes` bytes handed to `workers` workers; the throughput counts tasks.
    Tasks { workers: u32, bytes: usize },
}

/// One benchmark's results: ours first, then the baselines.
pub(crate) struct Comparison {
    pub bench: String,
    pub size: Size,
    pub contenders: Vec<(&'static str, Measure)>,
}

/// One contender's line of a table or of the JSON output.
pub(crate) struct Row {
    pub(crate) name: &'static str,
    pub(crate) summary: Summary,
    /// ours/baseline (p50, p99; the medians twice for throughput); `None` on ours.
    pub(crate) ratio: Option<(f64, f64)>,
}

impl Comparison {
    /// Each contender summarised, ours first, the baselines with ours/baseline.
    pub(crate) fn rows(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .contenders
            .iter()
            .map(|(name, measure)| Row {
                name,
                summary: summarize(measure),
                ratio: None,
            })
            .collect();
        if let Some((ours, baselines)) = rows.split_first_mut() {
            for baseline in baselines {
                baseline.ratio = Some(ours.summary.ratio_to(&baseline.summary));
            }
        }
        rows
    }
}

/// The size column: bytes per message, or workers.
pub(crate) fn size_text(size: Size) -> String {
    match size {
        Size::Bytes(bytes) => format!("{bytes} B"),
        Size::Workers(workers) => format!("{workers} workers"),
        Size::Peers(peers) => format!("{peers} peers"),
        Size::Tasks { workers, bytes } => format!("{workers}x {bytes} B"),
    }
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p / 100.0).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Prints comparisons as a table or as JSON lines, and keeps them for the results folder.
pub(crate) struct Report {
    json: bool,
    /// Whether a progress line is drawn: only on a terminal, never into a file or pipe.
    progress: bool,
    printed_header: bool,
    kept: Vec<Comparison>,
    notes: Vec<String>,
}

impl Report {
    fn new(json: bool) -> Self {
        use std::io::IsTerminal;
        Self {
            json,
            progress: !json && std::io::stderr().is_terminal(),
            printed_header: false,
            kept: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// A sentence about how the rows of `bench` were measured: printed under the table and kept
    /// for `results.md`.
    pub fn note(&mut self, bench: &str, text: &str) {
        let note = format!("{bench}: {text}.");
        if !self.json {
            println!("note: {note}");
        }
        self.notes.push(note);
    }

    /// Shows what is being measured, on a terminal only.
    pub fn progress(&self, what: &str) {
        if self.progress {
            eprint!("\r\x1b[2K  measuring {what} ...");
            std::io::stderr().flush().ok();
        }
    }

    pub fn add(&mut self, comparison: Comparison) {
        if self.progress {
            eprint!("\r\x1b[2K");
        }
        for row in comparison.rows() {
            if self.json {
                println!("{}", json_line(&comparison, &row));
            } else {
                self.table_line(&comparison, &row);
            }
        }
        if !self.json {
            println!();
        }
        self.kept.push(comparison);
    }

    fn table_line(&mut self, comparison: &Comparison, row: &Row) {
        if !self.printed_header {
            println!(
                "{:<24} {:>10}  {:<38} {:>10} {:>10} {:>13}  ours/baseline",
                "bench", "size", "impl", "p50", "p99", "per second"
            );
            self.printed_header = true;
        }
        let [p50, p99, rate, ratio] = row.summary.cells(comparison.size, row.ratio);
        println!(
            "{:<24} {:>10}  {:<38} {:>10} {:>10} {:>13}  {}",
            comparison.bench,
            size_text(comparison.size),
            row.name,
            p50,
            p99,
            rate,
            ratio
        );
    }

    fn finish(self) -> (Vec<Comparison>, Vec<String>) {
        if !self.json {
            println!(
                "ours/baseline: below 1 means ours is faster (latency); above 1 means ours moves more (throughput)."
            );
        }
        (self.kept, self.notes)
    }
}

/// A throughput for the tables: messages per second, bytes per second for messages of 4 KiB
/// and more, or tasks per second.
pub(crate) fn rate_text(size: Size, messages_per_s: f64) -> String {
    match size {
        Size::Tasks { .. } => format!("{:.1} k tasks", messages_per_s / 1e3),
        Size::Bytes(bytes) if bytes >= 4096 => {
            format!("{:.2} GB/s", messages_per_s * bytes as f64 / 1e9)
        }
        _ => format!("{:.2} M msgs", messages_per_s / 1e6),
    }
}

pub(crate) enum Summary {
    Latency {
        p50: u64,
        p99: u64,
        samples: usize,
        /// The lowest and highest p50 of one round, with two rounds or more.
        spread: Option<(u64, u64)>,
    },
    Throughput {
        median: f64,
        rounds: usize,
        /// The lowest and highest round, with two rounds or more.
        spread: Option<(f64, f64)>,
    },
}

impl Summary {
    /// A table row's p50, p99, rate and ours/baseline cells (empty where they do not apply).
    pub(crate) fn cells(&self, size: Size, ratio: Option<(f64, f64)>) -> [String; 4] {
        match self {
            Summary::Latency { p50, p99, .. } => [
                format!("{p50} ns"),
                format!("{p99} ns"),
                String::new(),
                ratio.map_or(String::new(), |(a, b)| format!("p50 {a:.2}x, p99 {b:.2}x")),
            ],
            Summary::Throughput { median, .. } => [
                String::new(),
                String::new(),
                rate_text(size, *median),
                ratio.map_or(String::new(), |(a, _)| format!("{a:.2}x")),
            ],
        }
    }

    /// The spread across rounds, as `low–high` (`-` with one round), in the summary's unit.
    pub(crate) fn spread_text(&self, size: Size) -> String {
        match self {
            Summary::Latency {
                spread: Some((low, high)),
                ..
            } => format!("{low}–{high} ns"),
            Summary::Throughput {
                spread: Some((low, high)),
                ..
            } => format!("{}–{}", rate_text(size, *low), rate_text(size, *high)),
            _ => "-".into(),
        }
    }
}

impl Summary {
    /// ours / other: (p50, p99) for latency, (median, median) for throughput.
    pub(crate) fn ratio_to(&self, other: &Summary) -> (f64, f64) {
        match (self, other) {
            (
                Summary::Latency { p50, p99, .. },
                Summary::Latency {
                    p50: b50, p99: b99, ..
                },
            ) => (*p50 as f64 / *b50 as f64, *p99 as f64 / *b99 as f64),
            (Summary::Throughput { median, .. }, Summary::Throughput { median: base, .. }) => {
                (median / base, median / base)
            }
            _ => (f64::NAN, f64::NAN),
        }
    }
}

pub(crate) fn summarize(measure: &Measure) -> Summary {
    match measure {
        Measure::Latency(rounds) => {
            let mut sorted = rounds.concat();
            sorted.sort_unstable();
            let round_p50s = rounds
                .iter()
                .filter(|round| !round.is_empty())
                .map(|round| {
                    let mut round = round.clone();
                    round.sort_unstable();
                    percentile(&round, 50.0)
                });
            let spread = round_p50s.fold(None, |range: Option<(u64, u64)>, p50| {
                Some(range.map_or((p50, p50), |(low, high)| (low.min(p50), high.max(p50))))
            });
            Summary::Latency {
                p50: percentile(&sorted, 50.0),
                p99: percentile(&sorted, 99.0),
                samples: sorted.len(),
                spread: spread.filter(|_| rounds.len() > 1),
            }
        }
        Measure::Throughput(rates) => Summary::Throughput {
            median: median(rates),
            rounds: rates.len(),
            spread: (rates.len() > 1).then(|| {
                let low = rates.iter().copied().fold(f64::INFINITY, f64::min);
                let high = rates.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (low, high)
            }),
        },
    }
}

pub(crate) fn json_line(comparison: &Comparison, row: &Row) -> String {
    let (name, summary, ratio) = (row.name, &row.summary, row.ratio);
    let size = match comparison.size {
        Size::Bytes(bytes) => format!(r#""msg_bytes":{bytes}"#),
        Size::Workers(workers) => format!(r#""workers":{workers}"#),
        Size::Peers(peers) => format!(r#""peers":{peers}"#),
        Size::Tasks { workers, bytes } => format!(r#""workers":{workers},"msg_bytes":{bytes}"#),
    };
    // What a throughput counts: tasks for a farm, messages otherwise.
    let unit = match comparison.size {
        Size::Tasks { .. } => "tasks",
        _ => "msgs",
    };
    let head = format!(
        r#"{{"bench":"{}","impl":"{}",{size}"#,
        comparison.bench, name
    );
    let body = match summary {
        Summary::Latency {
            p50,
            p99,
            samples,
            spread,
        } => {
            let ratio = ratio.map_or(String::new(), |(a, b)| {
                format!(r#","ours_over_baseline_p50":{a:.4},"ours_over_baseline_p99":{b:.4}"#)
            });
            let spread = spread.map_or(String::new(), |(low, high)| {
                format!(r#","round_p50_min_ns":{low},"round_p50_max_ns":{high}"#)
            });
            format!(r#","p50_ns":{p50},"p99_ns":{p99},"samples":{samples}{spread}{ratio}"#)
        }
        Summary::Throughput {
            median,
            rounds,
            spread,
        } => {
            let ratio = ratio.map_or(String::new(), |(a, _)| {
                format!(r#","ours_over_baseline":{a:.4}"#)
            });
            let bytes = match comparison.size {
                Size::Bytes(size) | Size::Tasks { bytes: size, .. } => {
                    format!(r#","bytes_per_s":{:.0}"#, median * size as f64)
                }
                Size::Workers(_) | Size::Peers(_) => String::new(),
            };
            let spread = spread.map_or(String::new(), |(low, high)| {
                format!(r#","round_min_{unit}_per_s":{low:.0},"round_max_{unit}_per_s":{high:.0}"#)
            });
            format!(r#","{unit}_per_s":{median:.0}{bytes},"rounds":{rounds}{spread}{ratio}"#)
        }
    };
    format!("{head}{body}}}")
}

/// One measurement of one contender.
pub(crate) type Run<'a> = &'a dyn Fn() -> Result<Measure, String>;

/// Runs `contenders` for `rounds` rounds, rotating their order each round; collects per name.
pub(crate) fn alternate(
    plan: Plan<'_>,
    contenders: &[(&'static str, Run<'_>)],
) -> Result<Vec<(&'static str, Measure)>, String> {
    let mut results: Vec<(&'static str, Option<Measure>)> =
        contenders.iter().map(|(name, _)| (*name, None)).collect();
    for round in 0..plan.rounds {
        for k in 0..contenders.len() {
            let index = (k + round) % contenders.len();
            let measured =
                (contenders[index].1)().map_err(|e| format!("{}: {e}", contenders[index].0))?;
            let slot = &mut results[index].1;
            *slot = Some(match (slot.take(), measured) {
                (None, m) => m,
                (Some(Measure::Latency(mut a)), Measure::Latency(b)) => {
                    a.extend(b);
                    Measure::Latency(a)
                }
                (Some(Measure::Throughput(mut a)), Measure::Throughput(b)) => {
                    a.extend(b);
                    Measure::Throughput(a)
                }
                _ => return Err("a contender changed its kind of measure".into()),
            });
        }
    }
    Ok(results
        .into_iter()
        .filter_map(|(name, measure)| Some((name, measure?)))
        .collect())
}

/// The CPUs this process may use, in order, read once: before the first measurement pins this
/// process to one of them (asked afterwards, the affinity mask would hold a single CPU and both
/// sides would end up sharing it).
fn allowed_cpus() -> &'static [usize] {
    static ALLOWED: OnceLock<Vec<usize>> = OnceLock::new();
    ALLOWED.get_or_init(|| {
        sched_getaffinity(Pid::from_raw(0)).map_or_else(
            |_| Vec::new(),
            |allowed| {
                (0..CpuSet::count())
                    .filter(|&cpu| allowed.is_set(cpu).unwrap_or(false))
                    .collect()
            },
        )
    })
}

thread_local! {
    /// The pair [`on_cpus`] pins measurements to for now, instead of [`cpu_pair`]'s default.
    static PINNED: std::cell::Cell<Option<(usize, usize)>> = const { std::cell::Cell::new(None) };
}

/// The CPUs to pin the two sides of a measurement to, if this process may use two: the first
/// two it may use, or the pair [`on_cpus`] chose.
pub(crate) fn cpu_pair() -> Option<(usize, usize)> {
    PINNED.get().or_else(|| match allowed_cpus() {
        [first, second, ..] => Some((*first, *second)),
        _ => None,
    })
}

/// Runs `measure` with its two sides pinned to `cpus` instead of the default pair.
pub(crate) fn on_cpus<R>(cpus: (usize, usize), measure: impl FnOnce() -> R) -> R {
    let before = PINNED.replace(Some(cpus));
    let result = measure();
    PINNED.set(before);
    result
}

/// Where the two sides of a latency measurement run, as this machine's topology tells it.
pub(crate) struct Placement {
    /// The bench name its rows carry.
    pub bench: &'static str,
    pub cpus: (usize, usize),
    /// The pair in words, for the report's notes.
    pub what: String,
}

/// The placements a two-sided latency bench can measure here: two separate cores, and two
/// hyperthreads of one core, each where the CPUs this process may use include such a pair.
/// A cache line moves between hyperthreads of one core through that core's own caches, several
/// times faster than between cores, so the two give very different floors and are reported
/// apart (`bench`, then `bench` + `_siblings`).
pub(crate) fn placements(bench: &'static str, siblings_bench: &'static str) -> Vec<Placement> {
    let allowed = allowed_cpus();
    let Some(&first) = allowed.first() else {
        return Vec::new();
    };
    let siblings = thread_siblings(first);
    let mut found = Vec::new();
    if let Some(&other) = allowed
        .iter()
        .find(|&&cpu| cpu != first && !siblings.contains(&cpu))
    {
        let shown = if allowed.iter().any(|&cpu| thread_siblings(cpu).len() > 1) {
            String::new()
        } else if is_virtual_machine() {
            "; this virtual machine shows no hyperthread siblings, but its host may still run \
             these two vCPUs on one physical core (then the floor rows are several times lower)"
                .into()
        } else {
            "; this machine has no hyperthread siblings".into()
        };
        found.push(Placement {
            bench,
            cpus: (first, other),
            what: format!("CPUs {first} and {other}, separate cores{shown}"),
        });
    }
    if let Some(&sibling) = allowed
        .iter()
        .find(|&&cpu| cpu != first && siblings.contains(&cpu))
    {
        found.push(Placement {
            bench: siblings_bench,
            cpus: (first, sibling),
            what: format!("CPUs {first} and {sibling}, hyperthreads of one core"),
        });
    }
    found
}

/// The CPUs sharing `cpu`'s core (itself included), from sysfs; just `cpu` when unknown.
fn thread_siblings(cpu: usize) -> Vec<usize> {
    let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
    std::fs::read_to_string(path)
        .ok()
        .and_then(|list| parse_cpu_list(list.trim()))
        .unwrap_or_else(|| vec![cpu])
}

/// A kernel CPU list such as `0,8` or `0-1,4`.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for range in list.split(',') {
        match range.split_once('-') {
            Some((low, high)) => cpus.extend(low.parse::<usize>().ok()?..=high.parse().ok()?),
            None => cpus.push(range.parse().ok()?),
        }
    }
    Some(cpus)
}

/// Whether the CPU says it runs under a hypervisor.
fn is_virtual_machine() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .filter(|line| line.starts_with("flags"))
            .any(|line| line.split_whitespace().any(|flag| flag == "hypervisor"))
    })
}

pub(crate) fn pin_to(cpu: usize) {
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = sched_setaffinity(Pid::from_raw(0), &set);
    }
}

/// Runs `child` in a forked process and `parent` here, each pinned to its own CPU when two are
/// available. Returns what `parent` returned once the child has exited successfully; a child
/// still running after [`CHILD_DEADLINE`] is killed.
///
/// Both closures must bound every wait they do, so that one side's failure ends the other.
pub(crate) fn fork_pair<R>(
    child: impl FnOnce() -> Result<(), String>,
    parent: impl FnOnce() -> Result<R, String>,
) -> Result<R, String> {
    let cpus = cpu_pair();
    std::io::stdout().flush().ok();
    std::io::stderr().flush().ok();
    // SAFETY: the benchmark runs on the main thread of a process that has started no other
    // thread, so the child gets a consistent copy of every lock and allocator state.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            if let Some((_, cpu)) = cpus {
                pin_to(cpu);
            }
            let code = match child() {
                Ok(()) => 0,
                Err(error) => {
                    eprintln!("benchmark child: {error}");
                    1
                }
            };
            // SAFETY: _exit ends this forked child without running the parent's exit handlers
            // or destructors a second time; nothing in the child needs flushing.
            unsafe { nix::libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            // Pinned only for this measurement: later ones (and their forks) get all CPUs back.
            let original = sched_getaffinity(Pid::from_raw(0)).ok();
            if let Some((cpu, _)) = cpus {
                pin_to(cpu);
            }
            let result = parent();
            if let Some(original) = original {
                let _ = sched_setaffinity(Pid::from_raw(0), &original);
            }
            let status = reap(child);
            let value = result?;
            match status? {
                WaitStatus::Exited(_, 0) => Ok(value),
                other => Err(format!("benchmark child ended with {other:?}")),
            }
        }
    }
}

/// Waits for `child` up to [`CHILD_DEADLINE`], then kills it.
fn reap(child: Pid) -> Result<WaitStatus, String> {
    let deadline = Instant::now() + CHILD_DEADLINE;
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)).map_err(|e| format!("waitpid: {e}"))? {
            WaitStatus::StillAlive if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            WaitStatus::StillAlive => {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(child, None);
                return Err("benchmark child did not finish in time; killed it".into());
            }
            status => return Ok(status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
        // A usage error names the argument; a suite and a helper's name are told apart.
        let error = Cli::try_parse_from(["bench", "--rounds", "0"]).unwrap_err();
        assert!(error.to_string().contains("--rounds <N>"), "{error}");
        let suite = Cli::try_parse_from(["bench", "queue", "--quick"]).unwrap();
        assert!(suite.helper.is_none() && suite.args.suite == Some(Suite::Queue));
        let rank =
            Cli::try_parse_from(["bench", "capi-rank", "all_reduce", "1", "0", "8"]).unwrap();
        assert!(matches!(rank.helper, Some(Helper::CapiRank(_))));
    }

    #[test]
    fn cpu_lists_are_read_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0,8"), Some(vec![0, 8]));
        assert_eq!(parse_cpu_list("0-2,5"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("x"), None);
    }
}
