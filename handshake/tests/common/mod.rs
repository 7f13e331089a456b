//! Helpers shared by the handshake test binaries.

use shmbroker_handshake::Config;
use std::path::PathBuf;

pub use shmbroker_sys::TempDir;

/// The socket path tests use inside their temporary directory.
pub fn socket(dir: &TempDir) -> PathBuf {
    dir.join("broker.sock")
}

/// A small world: rings of 64 slots.
pub fn config(world_size: u32) -> Config {
    Config {
        world_size,
        ring_capacity: 64,
        ..Config::default()
    }
}
