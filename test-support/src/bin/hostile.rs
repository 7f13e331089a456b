//! `hostile MODE --socket PATH`: see [`shmbroker_test_support::hostile`].

use clap::Parser;

/// A worker that attacks its peers' shared memory, for the tests.
#[derive(Debug, Parser)]
#[command(name = "hostile")]
struct Cli {
    #[command(flatten)]
    args: shmbroker_test_support::hostile::Args,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    shmbroker_cli::run_tool("hostile", || {
        shmbroker_test_support::hostile::run(&cli.args)
    })
}
