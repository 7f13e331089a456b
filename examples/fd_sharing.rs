//! Rank 0 creates a shared-memory file, passes its fd to every rank, and each rank writes its
//! own slot in it, then reads everyone's. An exchanged fd is the same open file in every process:
//! it shares the file offset, so use `pread`/`pwrite` or `mmap`, not `read`/`write` from several
//! ranks at once.
//!
//! ```text
//! cargo run --example fd_sharing
//! ```

mod common;

use shmbroker::Collectives;
use shmbroker::Session;
use std::error::Error;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

fn main() -> std::process::ExitCode {
    common::run(share)
}

fn share(session: &mut Session) -> Result<(), Box<dyn Error>> {
    let (rank, world) = (session.rank(), session.world_size());
    let created = if rank == 0 {
        let fd = shmbroker::queues::memfd::create_unsealed(c"example-shared")?;
        let file = File::from(fd);
        file.set_len(u64::from(world) * 8)?;
        Some(file)
    } else {
        None
    };
    let fd = session.broadcast_fd(0, created.as_ref().map(AsFd::as_fd))?;
    let file = File::from(fd);
    file.write_all_at(&u64::from(rank * 11).to_le_bytes(), u64::from(rank) * 8)?;
    session.barrier()?;
    let mut all = vec![0u8; world as usize * 8];
    file.read_exact_at(&mut all, 0)?;
    let values: Vec<u64> = all
        .chunks_exact(8)
        .map(|bytes| u64::from_le_bytes(bytes.try_into().expect("eight bytes")))
        .collect();
    println!("rank {rank} reads {values:?} from the file rank 0 shared");
    Ok(())
}
