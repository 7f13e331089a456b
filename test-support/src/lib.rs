//! What the workspace's multi-process tests (the top-level `tests/`, declared by this crate) start
//! besides the `shmbroker` command, each its own binary (`CARGO_BIN_EXE_<name>` in a test):
//!
//! * `hostile` ([`hostile`]): a worker that attacks its peers' shared memory and the broker;
//! * `farm-worker` ([`farm`]): a task farm's worker, honest or forging its departure;
//! * `regroup-worker` ([`regroup`]): a death and a rejoin during the survivors' group-making;
//! * `chaos` ([`chaos`]): the chaos suite, runnable by hand
//!   (`cargo run --release -p shmbroker-test-support --bin chaos -- --trials 100`), whose
//!   workers are its own hidden `chaos worker`;
//! * `cuda-check` (`cuda`, with `--features cuda`): real device memory between two workers;
//! * `shmbroker-under-test`: the `shmbroker` command itself (`shmbroker_cli::main`, as the
//!   shipped binary calls it), since Cargo gives a test the path of its own package's binaries
//!   only.
//!
//! The tests' plumbing comes from here too: [`process`] (a child with inherited fds, waited for
//! with a deadline and killed on drop) and [`TempDir`], the command's own.
//!
//! None of this is part of the product: the `shmbroker` binary and the `shmbroker` library link
//! none of it.

pub use shmbroker_cli::process;
pub use shmbroker_sys::TempDir;

pub mod chaos;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod farm;
pub mod hostile;
pub mod regroup;
pub mod rejoin_chaos;
pub mod soak;
