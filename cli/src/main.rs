//! `shmbroker`: the command (see `shmbroker --help`, and [`shmbroker_cli`] for what it does).

fn main() -> std::process::ExitCode {
    shmbroker_cli::main()
}
