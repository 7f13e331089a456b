//! `farm-worker --socket PATH --rank R`: see [`shmbroker_test_support::farm`].

use clap::Parser;

/// A task farm's worker, for the tests.
#[derive(Debug, Parser)]
#[command(name = "farm-worker")]
struct Cli {
    #[command(flatten)]
    args: shmbroker_test_support::farm::Args,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    shmbroker_cli::run_tool("farm-worker", || {
        shmbroker_test_support::farm::run(&cli.args)
    })
}
