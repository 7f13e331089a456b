//! Helpers shared by the handshake test binaries.

use shmbroker_handshake::Config;
use std::path::PathBuf;

/// A temp dir for one test's socket, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shmbroker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn socket(&self) -> PathBuf {
        self.0.join("broker.sock")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small world: rings of 64 slots.
pub fn config(world_size: u32) -> Config {
    Config {
        world_size,
        ring_capacity: 64,
        ..Config::default()
    }
}
