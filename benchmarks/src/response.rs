//! `response_wait` (in `bench farm`): the MindIE loop of issue 45. A scheduler's main thread
//! broadcasts 1 MiB batches to 3 workers while its response thread takes their replies with
//! `recv_any` on the same session; worker 1 spends 20 ms on every batch. The figure is how long
//! the fast workers' replies waited between their `send` and the response thread taking them.
//!
//! | bench | ours | baseline |
//! |---|---|---|
//! | `response_wait_c` | `capi/response.c`, `unpaced`: batch after batch, so once the outbox is full each broadcast waits for the slow worker's room | the same program, `paced`: batch `n + 1` only once every reply to batch `n` is in, so no broadcast waits (the floor) |
//! | `response_wait_python` | `python/response.py` on a split session, `unpaced` | the same, `paced` |
//!
//! Before the split halves gave the session up while they waited, a receive waited behind the
//! broadcast, which waited for the slow worker: the fast replies waited 17 ms at p50 (issue
//! 45). The ratio says what a broadcast waiting for a slow worker now costs the replies over the
//! floor.
//!
//! Each run is `bench run -n 4` of the program (fresh processes) with an 8 MiB outbox, so that
//! unpaced broadcasts wait for the slow worker from the ninth batch on; rounds alternate which
//! mode runs first. The Python contender runs under `SHMBROKER_BENCH_PYTHON` (default `python3`) and
//! is left out, saying so, when that Python cannot `import shmbroker`.

use super::mpi::{Program, compile, parse_lines, script};
use super::{Comparison, Measure, Plan, Report, Run, Size, alternate};
use std::ffi::OsString;
use std::process::Command;
use std::time::Duration;

/// Source of `response_wait`, the C contender.
const RESPONSE_C: &str = concat!(include_str!("c/bench.h"), include_str!("capi/response.c"));

/// Source of the Python contender.
const RESPONSE_PY: &str = include_str!("python/response.py");

/// The header the C program is built against (see `capi.rs`).
const HEADER: &str = include_str!("../../capi/include/shmbroker.h");

/// The scheduler and its 3 workers.
const WORLD: u32 = 4;

/// Bytes per batch.
const BATCH_BYTES: usize = 1 << 20;

/// The slow worker's time per batch.
const SLOW_MS: u64 = 20;

/// Each rank's outbox: 8 batches, so that from the ninth on an unpaced broadcast waits for the
/// slow worker's room in every round, not only past the default outbox's 64.
const OUTBOX_BYTES: usize = 8 << 20;

/// How long one run may take before it is killed.
const RUN_DEADLINE: Duration = Duration::from_secs(180);

/// The two modes, in the order of the table: ours first.
const MODES: [(&str, &str); 2] = [
    ("unpaced", "broadcasts wait for the 20 ms-slow worker"),
    ("paced", "paced: no broadcast waits (the floor)"),
];

/// Runs `response_wait_c` and `response_wait_python`.
///
/// # Errors
///
/// A contender failing (its stderr says why) or printing no samples.
pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    // 100 batches take 2 s at the slow worker's pace; the first 10 warm up (those that fit in
    // the outbox before any broadcast waits).
    let (batches, warmup) = (plan.size(100, 20), plan.size(10, 9));
    if plan.wants("response_wait_c") {
        match super::capi::available() {
            Ok(lib) => {
                let args: Vec<OsString> = vec![
                    "-Wall".into(),
                    "-pthread".into(),
                    "-L".into(),
                    lib.clone().into(),
                    "-lshmbroker".into(),
                    "-Xlinker".into(),
                    "-rpath".into(),
                    "-Xlinker".into(),
                    lib.into(),
                ];
                let program = compile(
                    "cc",
                    "response_wait",
                    RESPONSE_C,
                    &[("shmbroker.h", HEADER)],
                    &args,
                )?;
                let launch = |mode: &str| {
                    let mut command = launcher();
                    command.arg(program.exe());
                    (command, mode.to_owned())
                };
                compare(
                    plan,
                    report,
                    "response_wait_c",
                    &program,
                    launch,
                    batches,
                    warmup,
                )?;
            }
            Err(why) => eprintln!("bench: no C contender for response_wait_c ({why})"),
        }
    }
    if plan.wants("response_wait_python") {
        let python = std::env::var_os("SHMBROKER_BENCH_PYTHON").unwrap_or_else(|| "python3".into());
        let importable = Command::new(&python)
            .args(["-c", "import shmbroker"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if importable {
            let program = script("response_wait_py", "response.py", RESPONSE_PY)?;
            let launch = |mode: &str| {
                let mut command = launcher();
                command.arg(&python).arg(program.exe());
                (command, mode.to_owned())
            };
            compare(
                plan,
                report,
                "response_wait_python",
                &program,
                launch,
                batches,
                warmup,
            )?;
        } else {
            eprintln!(
                "bench: no Python contender for response_wait_python ({} cannot import \
                 shmbroker; set SHMBROKER_BENCH_PYTHON to a Python that can)",
                python.to_string_lossy()
            );
        }
    }
    report.note(
        "response_wait_c",
        "a scheduler broadcasts 1 MiB batches to 3 workers, one of them 20 ms slow on every \
         batch, while its response thread takes the replies with recv_any on the same session; \
         each figure is how long a fast worker's reply waited between its send and the response \
         thread taking it, with an 8 MiB outbox so that broadcasts wait from the ninth batch on. \
         Ours lets the broadcasts wait for the slow worker's room; the baseline \
         paces them so that none waits, the floor (issue 45 measured 17 ms at p50 for ours \
         before the split halves gave the session up while they waited). response_wait_python \
         is the same loop on a split Python session",
    );
    Ok(())
}

/// `bench run -n WORLD --timeout T --`, to which the program and its arguments are added.
fn launcher() -> Command {
    let exe = std::env::current_exe().unwrap_or_else(|_| "bench".into());
    let mut command = Command::new(exe);
    command
        .env_remove("LD_LIBRARY_PATH")
        .env("SHMBROKER_OUTBOX_BYTES", OUTBOX_BYTES.to_string())
        .arg("run")
        .arg("-n")
        .arg(WORLD.to_string())
        .arg("--timeout")
        .arg(RUN_DEADLINE.as_secs().to_string())
        .arg("--");
    command
}

/// Both modes of one contender, alternated, into one comparison named `bench`.
fn compare(
    plan: Plan<'_>,
    report: &mut Report,
    bench: &str,
    program: &Program,
    launch: impl Fn(&str) -> (Command, String),
    batches: usize,
    warmup: usize,
) -> Result<(), String> {
    report.progress(bench);
    let time = |mode: &str| -> Result<Measure, String> {
        let (mut command, mode) = launch(mode);
        command
            .arg(&mode)
            .args([batches, warmup, BATCH_BYTES, SLOW_MS as usize].map(|n| n.to_string()));
        let what = format!("bench run -n {WORLD} {bench} {mode}");
        let stdout =
            program.run_under(&mut command, &what, RUN_DEADLINE + Duration::from_secs(10))?;
        let samples: Vec<u64> = parse_lines(&stdout, "response_sample")
            .into_iter()
            .filter_map(|fields| fields.first().copied())
            .collect();
        if samples.is_empty() {
            return Err(format!("{what} printed no samples"));
        }
        Ok(Measure::latency(samples))
    };
    let unpaced = || time(MODES[0].0);
    let paced = || time(MODES[1].0);
    let runs: Vec<(&'static str, Run<'_>)> = vec![(MODES[0].1, &unpaced), (MODES[1].1, &paced)];
    let contenders = alternate(plan, &runs)?;
    report.add(Comparison {
        bench: bench.into(),
        size: Size::Workers(WORLD - 1),
        contenders,
    });
    Ok(())
}
