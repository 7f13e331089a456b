//! `regroup-worker`: see [`shmbroker_test_support::regroup`].

use clap::Parser;

/// One rank of the regroup scenario, under `shmbroker run -n 3 --restart 1`.
#[derive(Debug, Parser)]
#[command(name = "regroup-worker")]
struct Cli {
    #[command(flatten)]
    args: shmbroker_test_support::regroup::Args,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    shmbroker_cli::run_tool("regroup-worker", || {
        shmbroker_test_support::regroup::run(&cli.args)
    })
}
