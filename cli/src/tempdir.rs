//! A private temporary directory for sockets, removed with everything in it on drop.

use std::path::{Path, PathBuf};

pub struct TempDir(PathBuf);

impl TempDir {
    /// `$TMPDIR/shmbroker-<what>-<pid>`, created fresh.
    pub fn new(what: &str) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("shmbroker-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(Self(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
