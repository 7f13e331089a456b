//! The `shmbroker` command for the tests: the shipped binary's one line under another name (a
//! second binary named `shmbroker` would collide with the product's in `target/`).

fn main() -> std::process::ExitCode {
    shmbroker_cli::main()
}
