//! Private temporary directories, for sockets in tests and commands.

use std::io;
use std::path::{Path, PathBuf};

/// A directory only this uid can enter (mode 0700), created fresh under `$TMPDIR` (or `/tmp`)
/// as `shmbroker-<what>-<pid>-<n>`, and removed with everything in it on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates a new directory; `what` says what it is for (it appears in the name).
    ///
    /// # Errors
    ///
    /// Creating the directory failed (the error names the path).
    pub fn new(what: &str) -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("shmbroker-{what}-{}-{n}", std::process::id()));
        // Left by an earlier process of the same pid: not ours to keep.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
        Ok(Self(dir))
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside the directory.
    #[must_use]
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::TempDir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn each_is_new_private_and_gone_after_drop() {
        let (a, b) = (TempDir::new("t").unwrap(), TempDir::new("t").unwrap());
        assert_ne!(a.path(), b.path());
        let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::write(a.join("file"), b"x").unwrap();
        let path = a.path().to_owned();
        drop(a);
        assert!(!path.exists());
    }
}
