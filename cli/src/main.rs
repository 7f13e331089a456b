//! The `shmbroker` command: `demo`, `bench`, and the `ring-peer` helper the demo and tests use.

mod args;
mod bench;
mod chaos;
#[cfg(feature = "cuda")]
mod cuda;
mod demo;
mod hostile;
mod logging;
mod peer;
mod selftest;
mod serve;
mod tempdir;
mod worker;

use std::process::ExitCode;

const USAGE: &str = "\
shmbroker: single-node IPC over sealed shared-memory rings

USAGE:
    shmbroker demo [--workers N] [--messages N] [--round-trips N]
        Start a broker and N worker processes that log on and greet each other, then stream
        messages to a second process over a pair of rings.
    shmbroker serve --socket PATH --workers N ...
        Run a broker until SIGINT or SIGTERM.
    shmbroker worker --socket PATH [--rank R]
        Log on to a broker and greet every peer.
    shmbroker bench queue [--json] [--quick] [--rounds N]
        Measure the ring against shaq 4.3 and the physical floors, side by side.
    shmbroker ring-peer (sink|echo) ...
        The other end of a ring, for the demo and the tests (fds inherited at 3 and 4).
    shmbroker chaos [--trials N] [--workers N] [--seed S] [--json]
        Kill and corrupt workers at random moments; report detection times, hangs and leaks.
    shmbroker hostile (reopen|scribble) ...
        A worker that attacks its peers' shared memory, for the tests.
    shmbroker --help";

/// `shmbroker cuda-check --socket PATH --rank 0|1`; exits 2 (after saying why) with no driver.
#[cfg(feature = "cuda")]
fn cuda_check(rest: &[String]) -> ExitCode {
    let mut args = args::Args::new(rest);
    let parsed = (|| {
        let socket = args
            .value::<String>("--socket")?
            .ok_or("cuda-check needs --socket")?;
        let rank = args
            .value::<u32>("--rank")?
            .ok_or("cuda-check needs --rank 0 or 1")?;
        Ok::<_, String>((socket, rank))
    })();
    let outcome = parsed.and_then(|(socket, rank)| cuda::run(&socket, rank));
    match outcome {
        Ok(summary) => {
            println!("cuda-check: {summary}");
            ExitCode::SUCCESS
        }
        Err(error)
            if error.contains("libcuda.so.1 cannot be loaded") || error.starts_with("cuInit") =>
        {
            eprintln!("cuda-check: skipped: {error}");
            ExitCode::from(cuda::NO_DRIVER)
        }
        Err(error) => {
            eprintln!("cuda-check: {error}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    // `serve` installs its own, at `info`, once its signals are blocked (its log thread must not
    // take them).
    if args.first().map(String::as_str) != Some("serve")
        && let Err(error) = logging::init(tracing_subscriber::filter::LevelFilter::WARN)
    {
        eprintln!("shmbroker: {error}");
        return ExitCode::from(2);
    }
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo::run(rest),
        Some("bench") => bench::run(rest),
        Some("ring-peer") => peer::run(rest),
        Some("hostile") => hostile::run(rest),
        Some("chaos") => chaos::run(rest),
        Some("chaos-worker") => chaos::worker(rest),
        Some("serve") => serve::run(rest),
        Some("worker") => worker::run(rest),
        #[cfg(feature = "cuda")]
        Some("cuda-check") => return cuda_check(rest),
        None | Some("-h" | "--help" | "help") => {
            println!(
                "{USAGE}\n\n{}\n\n{}\n\n{}\n\n{}\n\n{}",
                serve::USAGE,
                worker::USAGE,
                chaos::USAGE,
                bench::USAGE,
                peer::USAGE
            );
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    };
    // What the library logged reaches standard error before the process ends.
    logging::drain(std::time::Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shmbroker: {error}");
            ExitCode::FAILURE
        }
    }
}
