//! The C ABI against the Rust API it wraps: `shmbroker_all_gather`, `shmbroker_all_reduce` and
//! `shmbroker_recv_any` called from a C program, and the same loops written in Rust against
//! `Session::all_gather_into`, `Session::all_reduce` and `Session::recv_any_into`, each started
//! as `WORLD` fresh processes by `shmbroker run -n WORLD` (this executable's hidden `run`, the
//! same code), so that nothing but the language and the ABI differs between the two.
//!
//! - [`CALLS_C`] (`bench run -n WORLD capi_calls CALL ROUNDS WARMUP SIZE`): the C side.
//! - [`rank`] (`bench run -n WORLD bench capi-rank CALL ROUNDS WARMUP SIZE`, a hidden
//!   subcommand): the Rust side, line for line the C program's loop.
//!
//! Both print `capi_sample NS` per timed round on rank 0.
//!
//! The C program is compiled with `cc -O2 -Wall` against the header this executable was built
//! with (`capi/include/shmbroker.h`, written beside the source), linked with `-lshmbroker` and an
//! rpath to the library's directory, as the README's `cc` line links it. `cargo build --release -p
//! shmbroker-capi` puts `libshmbroker.so` beside `target/release/bench`; without it, or
//! without `cc`, [`available`] says so and the bench is left out; a program that does not
//! compile fails the bench. CI's quick bench run covers the path where every check passes; a
//! wrong byte or a failing call ends either side with a message and a failed launcher.

use super::mpi::{Program, compile, parse_lines};
use shmbroker::Collectives;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Source of `capi_calls`: the C ABI's all-gather, all-reduce and recv_any, timed.
pub const CALLS_C: &str = concat!(include_str!("c/bench.h"), include_str!("capi/calls.c"));

/// The header the program is built against: the one committed beside the C ABI this
/// executable's source belongs to (CI checks it is what cbindgen makes of `capi/src/lib.rs`).
const HEADER: &str = include_str!("../../capi/include/shmbroker.h");

/// How long one run of the program under the launcher may take before it is killed.
const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// Where the C side can be built: the directory holding `libshmbroker.so` (this executable's
/// own), with `cc` on `PATH`.
///
/// # Errors
///
/// Either missing, saying which and how to get it. A library older than this executable may be
/// stale (built from other sources than the Rust side): that is said on stderr, and the bench
/// goes on.
pub fn available() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    let lib = dir.join("libshmbroker.so");
    if !lib.is_file() {
        return Err(format!(
            "no libshmbroker.so beside {} (build it: cargo build --release -p shmbroker-capi)",
            exe.display()
        ));
    }
    if super::mpi::find_on_path("cc").is_none() {
        return Err("no cc on PATH".into());
    }
    let modified = |path: &std::path::Path| std::fs::metadata(path).and_then(|m| m.modified());
    if let (Ok(lib_time), Ok(exe_time)) = (modified(&lib), modified(&exe))
        && lib_time < exe_time
    {
        eprintln!(
            "bench: {} is older than {}: if the library's sources changed since, rebuild it \
             (cargo build --release -p shmbroker-capi)",
            lib.display(),
            exe.display()
        );
    }
    Ok(dir.to_path_buf())
}

/// `capi_calls` built with `cc` against the `libshmbroker.so` in `lib` (see [`available`]).
///
/// # Errors
///
/// The compile failing, with the compiler's message.
pub fn build(lib: &std::path::Path) -> Result<Program, String> {
    // -Xlinker passes the directory whole (a comma in it would split a -Wl, list), and the
    // launcher clears LD_LIBRARY_PATH, so this library is the one the program loads.
    let args: Vec<OsString> = vec![
        "-Wall".into(),
        "-L".into(),
        lib.into(),
        "-lshmbroker".into(),
        "-Xlinker".into(),
        "-rpath".into(),
        "-Xlinker".into(),
        lib.into(),
    ];
    compile(
        "cc",
        "capi_calls",
        CALLS_C,
        &[("shmbroker.h", HEADER)],
        &args,
    )
}

/// Which side of the comparison runs.
#[derive(Clone, Copy, Debug)]
pub enum Side {
    /// The C program, calling the C ABI.
    C,
    /// This executable's `capi-rank`, calling the Rust API.
    Rust,
}

/// Which call both sides time (see `capi/calls.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Call {
    /// Every rank's bytes to every rank.
    AllGather,
    /// A sum of f32, in place.
    AllReduce,
    /// A ping-pong between ranks 0 and 1, each receiving from any peer.
    RecvAny,
}

impl Call {
    /// The name both programs take on their command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::AllGather => "all_gather",
            Self::AllReduce => "all_reduce",
            Self::RecvAny => "recv_any",
        }
    }
}

/// Rank 0's nanoseconds per round of `call` on `bytes` bytes among `workers` ranks, each a
/// process of `side` started by `bench run -n <workers>`, after `warmup` untimed rounds.
/// `program` is the C side; its directory holds the run's output either way.
///
/// # Errors
///
/// This executable not found; the launcher failing, timing out or exiting unsuccessfully (a
/// failing call's message is in its stderr); fewer samples printed than `rounds`.
pub fn time(
    program: &Program,
    side: Side,
    call: Call,
    workers: u32,
    rounds: usize,
    warmup: usize,
    bytes: usize,
) -> Result<Vec<u64>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let mut launcher = Command::new(&exe);
    launcher
        .env_remove("LD_LIBRARY_PATH")
        .arg("run")
        .arg("-n")
        .arg(workers.to_string())
        .arg("--timeout")
        .arg(RUN_DEADLINE.as_secs().to_string())
        .arg("--");
    let what = match side {
        Side::C => {
            launcher.arg(program.exe());
            format!("bench run -n {workers} capi_calls {}", call.name())
        }
        Side::Rust => {
            launcher.arg(&exe).arg("capi-rank");
            format!("bench run -n {workers} bench capi-rank {}", call.name())
        }
    };
    launcher.arg(call.name());
    launcher.args([rounds, warmup, bytes].map(|n| n.to_string()));
    // The launcher's own --timeout stops the copies first; this deadline is the backstop.
    let stdout = program.run_under(&mut launcher, &what, RUN_DEADLINE + Duration::from_secs(10))?;
    let samples: Vec<u64> = parse_lines(&stdout, "capi_sample")
        .into_iter()
        .filter_map(|fields| fields.first().copied())
        .collect();
    if samples.len() == rounds {
        Ok(samples)
    } else {
        Err(format!(
            "{what} printed {} samples, not {rounds}",
            samples.len()
        ))
    }
}

/// `bench capi-rank`: one rank of the Rust side of the `capi_*` benches.
#[derive(Debug, clap::Args)]
pub struct RankArgs {
    /// The call to time.
    call: Call,
    /// Timed rounds.
    #[arg(value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    rounds: u64,
    /// Untimed rounds before them.
    #[arg(value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    warmup: u64,
    /// Bytes each rank contributes (or sends).
    #[arg(value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    bytes: u64,
}

/// The loop of `capi/calls.c`, in Rust: joins from the environment with a 20 s deadline (also
/// every call's), then runs the call on buffers made once, with the same checks inside the timed
/// region, and prints rank 0's samples.
///
/// # Errors
///
/// Joining or a call failing, or a check finding the wrong data.
pub fn rank(args: &RankArgs) -> Result<(), String> {
    let timeout = Duration::from_secs(20);
    let mut session = shmbroker::Session::from_env(timeout).map_err(|e| format!("joining: {e}"))?;
    session.set_timeout(timeout);
    let (rank, world) = (session.rank(), session.world_size() as usize);
    let (rounds, warmup, bytes) = (
        args.rounds as usize,
        args.warmup as usize,
        args.bytes as usize,
    );
    if args.call == Call::AllReduce && bytes % 4 != 0 {
        return Err(format!("all_reduce of {bytes} bytes: not a number of f32"));
    }
    let data = vec![rank as u8; bytes];
    let mut out = vec![0xffu8; bytes * world];
    let mut floats = vec![0f32; bytes / 4];
    let sum = (world * (world + 1) / 2) as f32;
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..warmup + rounds {
        if args.call == Call::AllReduce {
            floats.fill((rank + 1) as f32);
        }
        let start = Instant::now();
        match args.call {
            Call::AllGather => {
                session
                    .all_gather_into(&data, &mut out)
                    .map_err(|e| format!("all_gather_into: {e}"))?;
                for (peer, part) in out.chunks(bytes).enumerate() {
                    if part[0] != peer as u8 {
                        return Err(format!("rank {rank}: rank {peer}'s part holds {}", part[0]));
                    }
                }
            }
            Call::AllReduce => {
                session
                    .all_reduce(&mut floats, shmbroker::ReduceOp::Sum)
                    .map_err(|e| format!("all_reduce: {e}"))?;
                if floats[0] != sum {
                    return Err(format!("rank {rank}: the sum is {}, not {sum}", floats[0]));
                }
            }
            Call::RecvAny if rank < 2 => {
                if rank == 0 {
                    session.send(1, &data).map_err(|e| format!("send: {e}"))?;
                }
                let (from, len) = session
                    .recv_any_into(&mut out[..bytes])
                    .map_err(|e| format!("recv_any_into: {e}"))?;
                if from != 1 - rank || len != bytes {
                    return Err(format!("rank {rank}: {len} bytes from rank {from}"));
                }
                if rank == 1 {
                    session
                        .send(0, &out[..len])
                        .map_err(|e| format!("send: {e}"))?;
                }
            }
            Call::RecvAny => {}
        }
        let elapsed = start.elapsed().as_nanos() as u64;
        if round >= warmup {
            samples.push(elapsed);
        }
    }
    if rank == 0 {
        let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
        for sample in samples {
            writeln!(stdout, "capi_sample {sample}").map_err(|e| e.to_string())?;
        }
        stdout.flush().map_err(|e| e.to_string())?;
    }
    // Nobody leaves before everyone is done (a ping-pong's other ranks only join).
    session.barrier().map_err(|e| format!("barrier: {e}"))
}
