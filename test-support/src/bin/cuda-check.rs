//! `cuda-check --socket PATH --rank 0|1`: see [`shmbroker_test_support::cuda`].

use clap::Parser;

/// Share real device memory between two workers (needs the CUDA driver at run time).
#[derive(Debug, Parser)]
#[command(name = "cuda-check")]
struct Cli {
    #[command(flatten)]
    args: shmbroker_test_support::cuda::Args,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    shmbroker_test_support::cuda::check(&cli.args)
}
