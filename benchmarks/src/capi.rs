//! The C ABI against the Rust API it wraps: `shmbroker_all_gather` called from a C program, and
//! the same loop written in Rust against `Session::all_gather_into`, each started as `WORLD`
//! fresh processes by `shmbroker run -n WORLD` (this executable's hidden `run`, the same code),
//! so that nothing but the language and the ABI differs between the two.
//!
//! - [`ALLGATHER_C`] (`bench run -n WORLD capi_allgather ROUNDS WARMUP SIZE`): the C side.
//! - [`rank`] (`bench run -n WORLD bench gather-rank ROUNDS WARMUP SIZE`, a hidden
//!   subcommand): the Rust side, line for line the C program's loop.
//!
//! Both print `capi_allgather_sample NS` per timed call on rank 0.
//!
//! The C program is compiled with `cc -O2 -Wall` against the header this executable was built
//! with (`capi/include/shmbroker.h`, written beside the source), linked with `-lshmbroker` and an
//! rpath to the library's directory, as the README's `cc` line links it. `cargo build --release -p
//! shmbroker-capi` puts `libshmbroker.so` beside `target/release/bench`; without it, or
//! without `cc`, [`available`] says so and the bench is left out; a program that does not
//! compile fails the bench. CI's quick bench run covers the path where every check passes; a
//! wrong byte or a failing call ends either side with a message and a failed launcher.

use super::mpi::{Program, compile, parse_lines};
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Source of `capi_allgather`: `shmbroker_all_gather` latency at any world size.
pub const ALLGATHER_C: &str = concat!(include_str!("c/bench.h"), include_str!("capi/all_gather.c"));

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

/// `capi_allgather` built with `cc` against the `libshmbroker.so` in `lib` (see [`available`]).
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
        "capi_allgather",
        ALLGATHER_C,
        &[("shmbroker.h", HEADER)],
        &args,
    )
}

/// Which side of the comparison runs.
#[derive(Clone, Copy, Debug)]
pub enum Side {
    /// The C program, calling `shmbroker_all_gather`.
    C,
    /// This executable's `gather-rank`, calling `Session::all_gather_into`.
    Rust,
}

/// Rank 0's nanoseconds per all-gather of `bytes` bytes among `workers` ranks, each a process of
/// `side` started by `bench run -n <workers>`, after `warmup` untimed calls. `program` is
/// the C side; its directory holds the run's output either way.
///
/// # Errors
///
/// This executable not found; the launcher failing, timing out or exiting unsuccessfully (a
/// failing call's message is in its stderr); fewer samples printed than `rounds`.
pub fn all_gather(
    program: &Program,
    side: Side,
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
            format!("bench run -n {workers} capi_allgather")
        }
        Side::Rust => {
            launcher.arg(&exe).arg("gather-rank");
            format!("bench run -n {workers} bench gather-rank")
        }
    };
    launcher.args([rounds, warmup, bytes].map(|n| n.to_string()));
    // The launcher's own --timeout stops the copies first; this deadline is the backstop.
    let stdout = program.run_under(&mut launcher, &what, RUN_DEADLINE + Duration::from_secs(10))?;
    let samples: Vec<u64> = parse_lines(&stdout, "capi_allgather_sample")
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

/// `bench gather-rank`: one rank of the Rust side of `capi_all_gather`.
#[derive(Debug, clap::Args)]
pub struct RankArgs {
    /// Timed all-gathers.
    #[arg(value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    rounds: u64,
    /// Untimed all-gathers before them.
    #[arg(value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    warmup: u64,
    /// Bytes each rank contributes.
    #[arg(value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    bytes: u64,
}

/// The loop of `capi/all_gather.c`, in Rust: joins from the environment with a 20 s deadline
/// (also every call's), then all-gathers from and into buffers made once, checks the first byte
/// of every rank's part inside the timed region, and prints rank 0's samples.
///
/// # Errors
///
/// Joining or an all-gather failing, or a rank's part holding the wrong byte.
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
    let data = vec![rank as u8; bytes];
    let mut out = vec![0xffu8; bytes * world];
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..warmup + rounds {
        let start = Instant::now();
        session
            .all_gather_into(&data, &mut out)
            .map_err(|e| format!("all_gather_into: {e}"))?;
        for (peer, part) in out.chunks(bytes).enumerate() {
            if part[0] != peer as u8 {
                return Err(format!("rank {rank}: rank {peer}'s part holds {}", part[0]));
            }
        }
        let elapsed = start.elapsed().as_nanos() as u64;
        if round >= warmup {
            samples.push(elapsed);
        }
    }
    if rank == 0 {
        let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
        for sample in samples {
            writeln!(stdout, "capi_allgather_sample {sample}").map_err(|e| e.to_string())?;
        }
        stdout.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}
