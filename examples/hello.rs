//! Four worker processes meet at a barrier, then each greets every other.
//!
//! ```text
//! cargo run --example hello
//! ```

mod common;

use shmbroker::Collectives;
use shmbroker::Session;
use std::error::Error;

fn main() -> std::process::ExitCode {
    common::run(hello)
}

fn hello(session: &mut Session) -> Result<(), Box<dyn Error>> {
    let (rank, world) = (session.rank(), session.world_size());
    session.barrier()?;
    for peer in (0..world).filter(|&peer| peer != rank) {
        session.send(peer, format!("hello from rank {rank}").as_bytes())?;
    }
    for peer in (0..world).filter(|&peer| peer != rank) {
        let greeting = session.recv(peer)?;
        println!("rank {rank} got: {}", String::from_utf8_lossy(&greeting));
    }
    Ok(())
}
