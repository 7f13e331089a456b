//! The pattern GPU programs use to share device memory: every rank exports a handle to its
//! buffer (here a host memfd stands in for GPU memory, so no GPU is needed), all-gathers the
//! handles with their fds, and maps its peers' buffers. With CUDA the handle would be a
//! `cudaIpcMemHandle_t` (`GpuHandleKind::CudaIpcMemory`, no fd) or a VMM POSIX fd
//! (`GpuHandleKind::CudaVmmPosixFd`, fd beside it); the calls are the same.
//!
//! ```text
//! cargo run --example gpu_handles
//! ```

mod common;

use shmbroker::{GpuHandle, GpuHandleKind, Session};
use std::error::Error;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

fn main() -> std::process::ExitCode {
    common::run(exchange)
}

const BUFFER_BYTES: u64 = 4096;

fn exchange(session: &mut Session) -> Result<(), Box<dyn Error>> {
    let rank = session.rank();
    // "Allocate device memory" and fill it.
    let fd = shmbroker::queues::memfd::create_unsealed(c"example-buffer")?;
    let buffer = File::from(fd);
    buffer.set_len(BUFFER_BYTES)?;
    buffer.write_all_at(&[rank as u8; 16], 0)?;
    // "Export" it.
    let handle = GpuHandle {
        buffer_id: u64::from(rank),
        // A memfd's handle is its fd, which travels beside it: no handle bytes.
        ..GpuHandle::new(GpuHandleKind::HostMemfd, BUFFER_BYTES, [0; 64])
    };
    let handles = session.all_gather_gpu_handles(&handle, Some(buffer.as_fd()))?;
    // "Open" every peer's buffer and read from it.
    for (peer, (handle, fd)) in handles.into_iter().enumerate() {
        let fd = fd.ok_or_else(|| format!("rank {peer} sent no fd"))?;
        let mut first = [0u8; 16];
        File::from(fd).read_exact_at(&mut first, 0)?;
        if first != [peer as u8; 16] {
            return Err(format!("rank {peer}'s buffer starts {first:?}").into());
        }
        if rank == 0 {
            println!(
                "rank {peer}: buffer {} of {} bytes, first bytes {:?}",
                handle.buffer_id,
                handle.size,
                &first[..4]
            );
        }
    }
    Ok(())
}
