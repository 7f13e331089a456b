//! Open MPI baselines: small C programs, embedded in this binary, built with `mpicc` and run
//! under `mpirun` at run time, so that a bench can print Open MPI's figures beside ours.
//!
//! - [`BULK_C`] (`mpirun -np 2 bulk ROUNDS WARMUP SIZE...`): ping-pong latency and one-way
//!   throughput of `MPI_Send`/`MPI_Recv`, printing `pingpong SIZE P50_NS P99_NS` and
//!   `throughput SIZE BYTES_PER_SEC` per size.
//! - [`ALLGATHER_C`] (`mpirun -np WORLD allgather ROUNDS WARMUP SIZE...`): `MPI_Allgather`
//!   latency on rank 0, printing `allgather WORLD SIZE P50_NS P99_NS` per size.
//! - [`REDUCTIONS_C`] (`mpirun -np WORLD reductions OP ROUNDS WARMUP BYTES...`):
//!   `MPI_Allreduce` of floats in place, `MPI_Reduce_scatter_block` or `MPI_Alltoall`, data
//!   changed and checked every round, printing `OP_sample WORLD BYTES NS` per call.
//! - [`BARRIER_C`] (`mpirun -np WORLD barrier ROUNDS WARMUP`): `MPI_Barrier` latency on rank 0,
//!   printing `barrier_sample WORLD NS` per call and `barrier WORLD P50_NS P99_NS`.
//! - [`FARM_C`] (`mpirun -np WORLD farm TASKS WARMUP DEPTH SIZE...`): a task farm whose reader
//!   takes answers with `MPI_ANY_SOURCE`, printing `farm WORKERS SIZE TASKS ELAPSED_NS` per size.
//!
//! [`parse_lines`] reads those lines back. Nothing here is needed to build shmbroker: without
//! `mpicc` and `mpirun` on `PATH`, [`available`] says so and the bench skips the baseline.
//!
//! The C ABI's bench (`capi.rs`) builds and runs its C program with the same machinery:
//! [`compile`] with `cc` instead of `mpicc`, and [`Program::run_under`] with `shmbroker run`
//! instead of `mpirun`.
//!
//! # Transport
//!
//! The baseline is Open MPI's own shared-memory path: the `ob1` messaging layer over the `self`
//! and shared-memory byte-transfer layers. The shared-memory layer is called `vader` in Open MPI
//! 3.x and 4.x and `sm` in 5.x, so [`Program::run`] asks `ompi_info --parsable` once per process
//! which of the two this installation has and sets `OMPI_MCA_btl=self,<that>` and
//! `OMPI_MCA_pml=ob1` (the btl list only binds `ob1`; pinning it keeps UCX, where it is built in
//! and usable, from taking over with transports of its own). If neither name shows up, or
//! `ompi_info` fails, it sets neither and Open MPI picks for itself. A variable already set in
//! the environment is left as it is, so `OMPI_MCA_btl=...` on the command line still wins.
//!
//! # Processes
//!
//! `mpirun` gets no stdin, and its stdout and stderr go to files in the program's temporary
//! directory, so no pipe can fill up and stall it. A run past its deadline, or one whose wait
//! fails, gets SIGTERM, on which `mpirun` kills its ranks, then SIGKILL two seconds later if it
//! is still there, and is reaped. Killing a process group would not reach the ranks: Open MPI
//! 4.1 starts each in a process group of its own. Ranks whose `mpirun` died of SIGKILL do exit
//! on their own, but only after about three seconds on Open MPI 4.1.4 (ranks asleep outside
//! MPI), spinning all the while if they were polling, which would skew whatever runs next.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Source of `bulk`: two-rank ping-pong latency and one-way throughput.
pub const BULK_C: &str = concat!(
    include_str!("c/bench.h"),
    include_str!("mpi/common.h"),
    include_str!("mpi/bulk.c")
);

/// Source of `allgather`: `MPI_Allgather` latency at any world size.
pub const ALLGATHER_C: &str = concat!(
    include_str!("c/bench.h"),
    include_str!("mpi/common.h"),
    include_str!("mpi/allgather.c")
);

/// Source of `reductions`: `MPI_Allreduce` (in place), `MPI_Reduce_scatter_block` and
/// `MPI_Alltoall` of floats, at any world size.
pub const REDUCTIONS_C: &str = concat!(
    include_str!("c/bench.h"),
    include_str!("mpi/common.h"),
    include_str!("mpi/reductions.c")
);

/// Source of `barrier`: `MPI_Barrier` latency at any world size.
pub const BARRIER_C: &str = concat!(
    include_str!("c/bench.h"),
    include_str!("mpi/common.h"),
    include_str!("mpi/barrier.c")
);

/// Source of `farm`: a task farm over `MPI_ANY_SOURCE`.
pub const FARM_C: &str = concat!(
    include_str!("c/bench.h"),
    include_str!("mpi/common.h"),
    include_str!("mpi/farm.c")
);

/// Source of `typed_farm`: a scheduler and its workers, 64-byte records each way over
/// `MPI_Send` and `MPI_Irecv` from `MPI_ANY_SOURCE`.
pub const TYPED_FARM_C: &str = concat!(
    include_str!("c/bench.h"),
    include_str!("mpi/common.h"),
    include_str!("mpi/typed_farm.c")
);

/// How long `mpicc` and `ompi_info` may run before they are killed.
const TOOL_DEADLINE: Duration = Duration::from_secs(120);

/// How often a wait with a deadline looks at the child.
const POLL: Duration = Duration::from_millis(10);

/// How long a child asked to stop with SIGTERM has before it gets SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// Makes every temporary directory and output file name in this process unique.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Ok when both `mpicc` and `mpirun` are executables on `PATH`.
///
/// # Errors
///
/// Names the missing tools: `"mpicc and mpirun not found on PATH"`.
pub fn available() -> Result<(), String> {
    let missing: Vec<&str> = ["mpicc", "mpirun"]
        .into_iter()
        .filter(|tool| find_on_path(tool).is_none())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("{} not found on PATH", missing.join(" and ")))
    }
}

/// The first executable file called `name` in a directory of `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// A C program built by [`build`] (Open MPI) or [`compile`]; its temporary directory goes with it
/// on drop.
#[derive(Debug)]
pub struct Program {
    /// `$TMPDIR/shmbroker-c-<pid>-<name>-<n>`: the source, the executable and run output.
    dir: PathBuf,
    exe: PathBuf,
}

/// Writes `source` to `<name>.c` in a fresh temporary directory and compiles it with
/// `mpicc -O2 -o <name> <name>.c`.
///
/// # Errors
///
/// As [`compile`], with `mpicc` as the compiler.
pub fn build(name: &str, source: &str) -> Result<Program, String> {
    compile("mpicc", name, source, &[], &[])
}

/// Writes `source` to `<name>.c`, and each of `headers` (file name, text) beside it, in a fresh
/// temporary directory, and compiles it with `<compiler> -O2 -I<that directory> -o <name>
/// <name>.c <extra_args>...`. The directory goes when the [`Program`] does, on every path out.
///
/// # Errors
///
/// A `name` that is empty or holds anything but ASCII letters, digits, `-` and `_`; a failure to
/// create the directory or write a file; the compiler failing to start, running past two
/// minutes or failing, with its status and stderr.
pub fn compile(
    compiler: &str,
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    extra_args: &[std::ffi::OsString],
) -> Result<Program, String> {
    let (program, src) = Program::written(name, &format!("{name}.c"), source, headers)?;
    let mut cc = Command::new(compiler);
    cc.arg("-O2")
        .arg("-I")
        .arg(&program.dir)
        .arg("-o")
        .arg(&program.exe)
        .arg(&src)
        .args(extra_args);
    let done = run_captured(&mut cc, &program.dir, TOOL_DEADLINE)
        .map_err(|e| format!("{compiler}: {e}"))?;
    if done.status.success() {
        Ok(program)
    } else {
        Err(format!(
            "{compiler} -O2 {} exited with {}: {}",
            src.display(),
            done.status,
            done.stderr.trim()
        ))
    }
}

/// `source` written as `file` into a fresh temporary directory, beside nothing: a script its
/// interpreter runs (the program's executable is the script).
///
/// # Errors
///
/// `name` not `[A-Za-z0-9_-]+`, or the file not written.
pub fn script(name: &str, file: &str, source: &str) -> Result<Program, String> {
    let (mut program, path) = Program::written(name, file, source, &[])?;
    program.exe = path;
    Ok(program)
}

impl Program {
    /// A fresh temporary directory for `name` with `source` in it as `file` and each of
    /// `headers` beside it; the program (its executable `name` in it) and the source's path.
    fn written(
        name: &str,
        file: &str,
        source: &str,
        headers: &[(&str, &str)],
    ) -> Result<(Self, PathBuf), String> {
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!("program name {name:?} is not [A-Za-z0-9_-]+"));
        }
        let dir = std::env::temp_dir().join(format!(
            "shmbroker-c-{}-{name}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // From here on the directory is removed on every path out, error or not.
        let program = Program {
            exe: dir.join(name),
            dir,
        };
        let src = program.dir.join(file);
        for (file, text) in std::iter::once((src.clone(), source)).chain(
            headers
                .iter()
                .map(|&(file, text)| (program.dir.join(file), text)),
        ) {
            std::fs::write(&file, text).map_err(|e| format!("writing {}: {e}", file.display()))?;
        }
        Ok((program, src))
    }
}

impl Program {
    /// Runs `mpirun -np <ranks> --oversubscribe --bind-to none <exe> <args>...` (allowed to run
    /// as root, over shared memory: see the module docs) and returns its stdout once it exits.
    ///
    /// # Errors
    ///
    /// `mpirun` failing to start, running past `timeout` (it is then killed and reaped), or
    /// exiting unsuccessfully, with its status and stderr.
    pub fn run(&self, ranks: u32, args: &[String], timeout: Duration) -> Result<String, String> {
        let mut mpirun = Command::new("mpirun");
        mpirun
            .arg("-np")
            .arg(ranks.to_string())
            .args(["--oversubscribe", "--bind-to", "none"])
            .arg(&self.exe)
            .args(args)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        if let Some(btl) = shared_memory_btl(&self.dir) {
            for (key, value) in [
                ("OMPI_MCA_btl", format!("self,{btl}")),
                ("OMPI_MCA_pml", "ob1".into()),
            ] {
                if std::env::var_os(key).is_none() {
                    mpirun.env(key, value);
                }
            }
        }
        self.run_under(&mut mpirun, &format!("mpirun -np {ranks}"), timeout)
    }

    /// The executable.
    pub fn exe(&self) -> &Path {
        &self.exe
    }

    /// Runs `launcher`, a command that starts this program (`mpirun`, `shmbroker run`), as
    /// [`run_captured`] does in this program's directory, and returns its stdout once it exits;
    /// `what` names the launcher in errors.
    ///
    /// # Errors
    ///
    /// The launcher failing to start, running past `timeout` (it is then killed and reaped), or
    /// exiting unsuccessfully, with its status and stderr.
    pub fn run_under(
        &self,
        launcher: &mut Command,
        what: &str,
        timeout: Duration,
    ) -> Result<String, String> {
        let exe = self.exe.display();
        let done =
            run_captured(launcher, &self.dir, timeout).map_err(|e| format!("{what} {exe}: {e}"))?;
        if done.status.success() {
            Ok(done.stdout)
        } else {
            Err(format!(
                "{what} {exe} exited with {}: {}",
                done.status,
                done.stderr.trim()
            ))
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `command` as [`run_captured`] does, in a scratch directory of its own, and returns its
/// stdout once it exits; `what` names it in errors.
///
/// # Errors
///
/// As [`Program::run_under`].
pub fn output_within(
    command: &mut Command,
    what: &str,
    timeout: Duration,
) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!(
        "shmbroker-bench-{}-{}",
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let done = run_captured(command, &dir, timeout);
    let _ = std::fs::remove_dir_all(&dir);
    let done = done.map_err(|e| format!("{what}: {e}"))?;
    if done.status.success() {
        Ok(done.stdout)
    } else {
        Err(format!(
            "{what} exited with {}: {}",
            done.status,
            done.stderr.trim()
        ))
    }
}

/// The shared-memory btl this Open MPI has, `vader` (3.x, 4.x) or `sm` (5.x), asked of
/// `ompi_info --parsable` once per process; `None` when it has neither or cannot say.
fn shared_memory_btl(scratch: &Path) -> Option<&'static str> {
    static BTL: OnceLock<Option<&'static str>> = OnceLock::new();
    *BTL.get_or_init(|| {
        let mut ompi_info = Command::new("ompi_info");
        ompi_info.arg("--parsable");
        let done = run_captured(&mut ompi_info, scratch, TOOL_DEADLINE).ok()?;
        if !done.status.success() {
            return None;
        }
        ["vader", "sm"].into_iter().find(|name| {
            let prefix = format!("mca:btl:{name}:");
            done.stdout.lines().any(|line| line.starts_with(&prefix))
        })
    })
}

/// What [`run_captured`] saw of a child that exited.
#[derive(Debug)]
struct Captured {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `command` with no stdin and its stdout and stderr in fresh files under `dir`, waits for
/// it until `timeout` has passed, and returns what it printed (lossily decoded).
fn run_captured(command: &mut Command, dir: &Path, timeout: Duration) -> Result<Captured, String> {
    let stem = dir.join(format!("run-{}", SEQUENCE.fetch_add(1, Ordering::Relaxed)));
    let out_path = stem.with_extension("out");
    let err_path = stem.with_extension("err");
    let create =
        |path: &Path| File::create(path).map_err(|e| format!("creating {}: {e}", path.display()));
    command
        .stdin(Stdio::null())
        .stdout(create(&out_path)?)
        .stderr(create(&err_path)?);
    let child = command.spawn().map_err(|e| format!("starting: {e}"))?;
    let status = Running {
        child,
        exited: false,
    }
    .wait(timeout)?;
    let read = |path: &Path| {
        std::fs::read(path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .map_err(|e| format!("reading {}: {e}", path.display()))
    };
    let captured = Captured {
        status,
        stdout: read(&out_path)?,
        stderr: read(&err_path)?,
    };
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    Ok(captured)
}

/// A child that is killed (SIGKILL) and reaped on drop unless it was seen to exit.
#[derive(Debug)]
struct Running {
    child: Child,
    exited: bool,
}

impl Running {
    /// Polls the child every 10 ms until it exits or `timeout` has passed; on the way out
    /// without an exit status, drop kills it.
    fn wait(mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.exited = true;
                    return Ok(status);
                }
                Ok(None) if Instant::now() >= deadline => {
                    return Err(format!("still running after {timeout:?}, killed"));
                }
                Ok(None) => std::thread::sleep(POLL),
                Err(e) => return Err(format!("waiting: {e}")),
            }
        }
    }
}

impl Drop for Running {
    /// SIGTERM first, sent with the `kill` utility since std has no call for it: `mpirun` then
    /// takes its ranks down and removes its session directory. After [`TERM_GRACE`], or at once
    /// if `kill` could not be run, SIGKILL, and reap.
    fn drop(&mut self) {
        if self.exited {
            return;
        }
        // The child is not reaped yet, so its pid still names it.
        let asked = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if asked {
            let deadline = Instant::now() + TERM_GRACE;
            while Instant::now() < deadline {
                match self.child.try_wait() {
                    Ok(Some(_)) => return,
                    Ok(None) => std::thread::sleep(POLL),
                    Err(_) => break,
                }
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The numeric fields of every line of `stdout` whose first word is `word`, in order; fields
/// that are not unsigned integers are left out.
///
/// `parse_lines("pingpong 4096 5200 9100\n", "pingpong")` is `[[4096, 5200, 9100]]`.
pub fn parse_lines(stdout: &str, word: &str) -> Vec<Vec<u64>> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next() == Some(word))
                .then(|| fields.filter_map(|field| field.parse().ok()).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_lines_picks_lines_by_first_word() {
        let text = "\
pingpong 4096 4707 78036
throughput 4096 1785887132
pingpongs 1 2 3
  pingpong 65536 15000 20000
warning: pingpong 1 2
pingpong 1048576 x 193887
allgather 4 64 6580 17646
";
        assert_eq!(
            parse_lines(text, "pingpong"),
            vec![
                vec![4096, 4707, 78036],
                vec![65536, 15000, 20000],
                vec![1048576, 193887],
            ]
        );
        assert_eq!(
            parse_lines(text, "throughput"),
            vec![vec![4096, 1785887132]]
        );
        assert_eq!(
            parse_lines(text, "allgather"),
            vec![vec![4, 64, 6580, 17646]]
        );
        assert!(parse_lines(text, "barrier").is_empty());
        assert!(parse_lines("", "pingpong").is_empty());
    }

    #[test]
    fn build_rejects_a_name_that_is_not_a_plain_word() {
        for name in ["", "../bulk", "a b", "bulk.c"] {
            let err = build(name, BULK_C).unwrap_err();
            assert!(err.contains("is not [A-Za-z0-9_-]+"), "{name:?}: {err}");
        }
    }

    #[test]
    fn bulk_reports_pingpong_and_throughput_per_size() {
        if let Err(why) = available() {
            println!("skipping the Open MPI bulk baseline: {why}");
            return;
        }
        let program = build("bulk", BULK_C).unwrap();
        let dir = program.dir.clone();
        assert!(program.exe.is_file());
        let sizes = [4096u64, 65536];
        let args: Vec<String> = ["20", "2"]
            .into_iter()
            .map(String::from)
            .chain(sizes.iter().map(u64::to_string))
            .collect();
        let stdout = program.run(2, &args, Duration::from_secs(60)).unwrap();
        let pingpong = parse_lines(&stdout, "pingpong");
        let throughput = parse_lines(&stdout, "throughput");
        assert_eq!(pingpong.len(), sizes.len(), "{stdout}");
        assert_eq!(throughput.len(), sizes.len(), "{stdout}");
        for ((size, latency), rate) in sizes.iter().zip(&pingpong).zip(&throughput) {
            let &[got, p50, p99] = latency.as_slice() else {
                panic!("pingpong line with {} numbers: {stdout}", latency.len());
            };
            assert_eq!(got, *size, "{stdout}");
            assert!(0 < p50 && p50 <= p99, "{stdout}");
            assert_eq!(rate.len(), 2, "{stdout}");
            assert_eq!(rate[0], *size, "{stdout}");
            assert!(rate[1] > 0, "{stdout}");
        }
        drop(program);
        assert!(!dir.exists(), "{} outlived its Program", dir.display());
    }

    #[test]
    fn a_failing_run_reports_status_and_stderr() {
        if let Err(why) = available() {
            println!("skipping the Open MPI bulk baseline: {why}");
            return;
        }
        let program = build("bulk", BULK_C).unwrap();
        // bulk wants exactly two ranks.
        let args = ["2".to_string(), "0".to_string(), "64".to_string()];
        let err = program.run(1, &args, Duration::from_secs(60)).unwrap_err();
        assert!(err.contains("needs exactly 2 ranks"), "{err}");
    }

    #[test]
    fn a_compile_error_carries_mpicc_stderr() {
        if let Err(why) = available() {
            println!("skipping the Open MPI build check: {why}");
            return;
        }
        let err = build("broken", "int main(void) { return undeclared_name; }\n").unwrap_err();
        assert!(err.contains("undeclared_name"), "{err}");
    }

    #[test]
    fn a_run_past_its_deadline_is_killed() {
        if let Err(why) = available() {
            println!("skipping the Open MPI deadline check: {why}");
            return;
        }
        let source = "#include <mpi.h>\n#include <unistd.h>\n\
            int main(int argc, char **argv) { MPI_Init(&argc, &argv); sleep(600); \
            MPI_Finalize(); return 0; }\n";
        let program = build("sleeper", source).unwrap();
        let started = Instant::now();
        let err = program.run(2, &[], Duration::from_secs(3)).unwrap_err();
        assert!(err.contains("killed"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(60), "{err}");
        // The ranks go too (zombies have an empty cmdline and do not count).
        let exe = program.exe.as_os_str().as_encoded_bytes().to_vec();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = processes_running(&exe);
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "ranks left running: {left:?}");
            std::thread::sleep(POLL);
        }
    }

    /// Pids whose command line starts with `exe`.
    fn processes_running(exe: &[u8]) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
                cmdline
                    .starts_with(exe)
                    .then(|| entry.file_name().to_string_lossy().into_owned())
            })
            .collect()
    }
}
