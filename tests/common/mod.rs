//! Helpers shared by the multi-process test binaries.

#![allow(dead_code)] // each test binary uses its own subset

use shmbroker::process::ChildGuard;
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

/// How long any child of a test may run before it is killed and the test fails.
pub const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// `$TMPDIR/shmbroker-<name>-<pid>`, created fresh and removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shmbroker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits for `child` (failing the test if it outlives [`CHILD_DEADLINE`]; the guard then kills
/// it) and returns (success, stdout, stderr). The pipes are read after the exit: a read would
/// block on a hung child, the wait does not (outputs here are far below a pipe's buffer).
pub fn finish(mut child: ChildGuard) -> (bool, String, String) {
    let status = child
        .wait_timeout(CHILD_DEADLINE)
        .unwrap()
        .expect("a child was still running at its deadline");
    let mut stdout = String::new();
    if let Some(pipe) = child.stdout() {
        let _ = pipe.read_to_string(&mut stdout);
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.take_stderr() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    (status.success(), stdout, stderr)
}
