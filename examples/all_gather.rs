//! Every rank contributes a value and gets everyone's: the building block of "who is where"
//! (addresses, device ids, buffer sizes) at start-up.
//!
//! ```text
//! cargo run --example all_gather
//! ```

mod common;

use shmbroker::Collectives;
use shmbroker::Session;
use std::error::Error;

fn main() -> std::process::ExitCode {
    common::run(gather)
}

fn gather(session: &mut Session) -> Result<(), Box<dyn Error>> {
    let rank = session.rank();
    // Parts of any size, different on every rank.
    let mine = format!("rank {rank} runs pid {}", std::process::id());
    let everyone = session.all_gather(mine.as_bytes())?;
    // Plain-old-data values, typed.
    let load = session.all_gather_pod(&(u64::from(rank) * 100))?;
    if rank == 0 {
        for (peer, (text, load)) in everyone.iter().zip(&load).enumerate() {
            println!(
                "rank {peer}: {} (load {load})",
                String::from_utf8_lossy(text)
            );
        }
    }
    Ok(())
}
