//! A server answering requests from 4 worker processes in one tokio task: it takes each request
//! from whichever worker sent it (`AsyncReceiver::recv_any`) and answers that worker, while the
//! runtime's thread is free for anything else between requests.
//!
//! ```text
//! cargo run --example tokio_server --features tokio
//! ```

mod common;

use shmbroker::Session;
use std::error::Error;

/// The server and 4 workers.
const WORLD: u32 = 5;

/// Requests each worker sends, one at a time.
const REQUESTS: u64 = 1_000;

fn main() -> std::process::ExitCode {
    common::run_world(WORLD, |session| {
        if session.rank() == 0 {
            serve(session)
        } else {
            ask(session)
        }
    })
}

/// Rank 0: answers every request with its square until each worker has said it is done (an
/// empty message).
fn serve(session: Session) -> Result<Session, Box<dyn Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let workers = session.world_size() - 1;
        let (sender, receiver) = session.split();
        let receiver = receiver.into_async()?;
        let (mut done, mut served) = (0, 0u64);
        while done < workers {
            let (worker, request) = receiver.recv_any().await?;
            if request.is_empty() {
                done += 1;
                continue;
            }
            let number = u64::from_le_bytes(
                request
                    .try_into()
                    .map_err(|bytes: Vec<u8>| format!("a request of {} bytes", bytes.len()))?,
            );
            sender.send(worker, &number.wrapping_mul(number).to_le_bytes())?;
            served += 1;
        }
        println!("rank 0 served {served} requests from {workers} workers in one task");
        Ok(sender.rejoin(receiver.into_inner())?)
    })
}

/// Ranks 1 to 4: send numbers, check each square, then say done.
fn ask(mut session: Session) -> Result<Session, Box<dyn Error>> {
    let rank = session.rank();
    for i in 0..REQUESTS {
        let number = u64::from(rank) * 1_000_000 + i;
        session.send(0, &number.to_le_bytes())?;
        let answer = session.recv(0)?;
        if answer != number.wrapping_mul(number).to_le_bytes() {
            return Err(format!("rank {rank}: {number} squared came back as {answer:?}").into());
        }
    }
    session.send(0, &[])?;
    println!("rank {rank}: {REQUESTS} answers, all right");
    Ok(session)
}
