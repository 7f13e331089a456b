//! The `shmbroker` command: the broker service, the launcher, a worker and a demo. The benchmarks
//! (`benchmarks/`) and the test helpers and chaos suite (`test-support/`) are tools of their own,
//! which start this command's `run` and `serve` and share its selftest through this library.
//!
//! The command line is clap's: `--help` on every subcommand, `--version`, `--name=value`, exit
//! code 2 for a usage error and 1 for a failure. The binary calls [`main`]; other tools of the
//! workspace start a subcommand with [`execute`].

mod demo;
pub mod logging;
mod peer;
pub mod process;
pub mod run;
pub mod selftest;
pub mod serve;
pub mod status;
mod worker;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

/// Single-node IPC over sealed shared-memory rings: a broker hands each worker its rings and
/// outboxes, then gets out of the way.
#[derive(Debug, Parser)]
#[command(
    name = "shmbroker",
    bin_name = "shmbroker",
    version,
    propagate_version = true
)]
struct Cli {
    /// Log lines on standard error as text, or as JSON objects (timestamp, level, target and
    /// the event's fields, one per line). RUST_LOG or SHMBROKER_LOG sets the level.
    #[arg(long, global = true, value_enum, default_value_t = logging::Format::Text)]
    log_format: logging::Format,

    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a broker and worker processes that log on and greet each other, then stream
    /// messages to a second process over a pair of rings.
    Demo(demo::Args),
    /// Start a broker and N copies of a program that find it from their environment; exit with
    /// the first failing copy's status.
    Run(run::Args),
    /// Run a broker in the foreground, job after job, until SIGINT or SIGTERM.
    Serve(serve::Args),
    /// Show what a running job's ranks are doing, asked of its broker.
    Status(status::Args),
    /// Log on to a broker and greet every peer (or run every collective with --selftest).
    Worker(worker::Args),
    /// Print a completion script for SHELL to standard output.
    #[command(
        after_help = "For example: shmbroker completions bash > /etc/bash_completion.d/shmbroker"
    )]
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// The other end of a ring, for the demo (and the tests; fds inherited at 3 and 4).
    #[command(hide = true)]
    RingPeer(peer::Args),
    /// Removes `run`'s socket directory once standard input closes: when `run` ends, however it
    /// ends (SIGKILL included).
    #[command(hide = true)]
    SweepAfter {
        /// The directory (a `run` socket directory, or nothing is removed).
        dir: std::path::PathBuf,
    },
}

/// The `shmbroker` command: parses the command line and runs it.
#[must_use]
pub fn main() -> ExitCode {
    // Usage errors print clap's message and exit 2; --help and --version exit 0.
    let cli = Cli::parse();
    execute(cli.command, cli.log_format)
}

/// Runs `command` as `shmbroker` would, logging as `log_format` says, to its exit status.
#[must_use]
pub fn execute(command: Command, log_format: logging::Format) -> ExitCode {
    // `run` takes SIGINT, SIGTERM and SIGQUIT from a signalfd: blocked before the log thread exists, which
    // would otherwise take them (and die of them).
    if matches!(command, Command::Run(_))
        && let Err(error) = run::block_stop_signals()
    {
        eprintln!("shmbroker run: {error}");
        return ExitCode::FAILURE;
    }
    // `serve` installs its own, at `info`, once its signals are blocked (its log thread must not
    // take them).
    if !matches!(command, Command::Serve(_))
        && let Err(error) = logging::init(tracing_subscriber::filter::LevelFilter::WARN, log_format)
    {
        eprintln!("shmbroker: {error}");
        return ExitCode::from(2);
    }
    let result = match command {
        Command::Demo(args) => demo::run(&args),
        // The job's exit status is its first failing copy's, not 0 or 1.
        Command::Run(args) => return run::run(&args),
        Command::Serve(args) => serve::run(args, log_format),
        Command::Worker(args) => worker::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "shmbroker",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::RingPeer(args) => peer::run(&args),
        Command::SweepAfter { dir } => run::sweep_after(&dir),
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

/// Runs `body` as a tool of the workspace beside `shmbroker` (the benchmarks, a test helper):
/// what the library logs at `warn` and above on standard error as text, an error printed after
/// `name: ` and exit status 1, usage errors (clap's, before this) 2.
#[must_use]
pub fn run_tool(name: &str, body: impl FnOnce() -> Result<(), String>) -> ExitCode {
    if let Err(error) = logging::init(
        tracing_subscriber::filter::LevelFilter::WARN,
        logging::Format::Text,
    ) {
        eprintln!("{name}: {error}");
        return ExitCode::from(2);
    }
    let result = body();
    logging::drain(std::time::Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{name}: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
