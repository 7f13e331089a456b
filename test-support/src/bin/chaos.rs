//! `chaos [--trials N] [--workers N] ...`: see [`shmbroker_test_support::chaos`].

use clap::{Parser, Subcommand};
use shmbroker_test_support::chaos;
use std::process::ExitCode;

/// Kill and corrupt workers at random moments; report detection times, hangs and leaks.
#[derive(Debug, Parser)]
#[command(name = "chaos", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(flatten)]
    args: chaos::Args,
    #[command(subcommand)]
    part: Option<Part>,
}

/// The processes a trial starts from this executable.
#[derive(Debug, Subcommand)]
enum Part {
    /// One worker of a trial.
    #[command(hide = true)]
    Worker(chaos::WorkerArgs),
    /// One rank of a `--rejoin` trial.
    #[command(hide = true)]
    RejoinWorker(shmbroker_test_support::rejoin_chaos::WorkerArgs),
    /// One rank of the soak's job.
    #[command(hide = true)]
    SoakWorker(shmbroker_test_support::soak::WorkerArgs),
    /// `shmbroker serve`: the broker of the trials.
    #[command(hide = true)]
    Serve(shmbroker_cli::serve::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.part {
        None => shmbroker_cli::run_tool("chaos", || chaos::run(&cli.args)),
        Some(Part::Worker(args)) => {
            shmbroker_cli::run_tool("chaos worker", || chaos::worker(&args))
        }
        Some(Part::RejoinWorker(args)) => shmbroker_cli::run_tool("chaos rejoin-worker", || {
            shmbroker_test_support::rejoin_chaos::worker(&args)
        }),
        Some(Part::SoakWorker(args)) => shmbroker_cli::run_tool("chaos soak-worker", || {
            shmbroker_test_support::soak::worker(&args)
        }),
        Some(Part::Serve(args)) => shmbroker_cli::execute(
            shmbroker_cli::Command::Serve(args),
            shmbroker_cli::logging::Format::Text,
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_consistent() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
