//! `shmbroker ring-peer`: the other end of a ring, in its own process.
//!
//! The demo and the multi-process tests start this with ring fds inherited at 3 (and 4); see
//! [`crate::process::spawn_with_fds`]. Every wait in here has a deadline, so a peer whose
//! partner died exits with an error instead of hanging.

use crate::process::inherited_fd;
use shmbroker::queues::Waiting;
use shmbroker::queues::{Consumer, Producer, RecvTimeoutError};
use std::os::fd::AsFd;
use std::time::Duration;

/// How long a peer waits for its partner before giving up.
const PARTNER_TIMEOUT: Duration = Duration::from_secs(30);

/// `shmbroker ring-peer`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    role: Role,
    /// Spins before a wait parks.
    #[arg(long, global = true)]
    spin: Option<u32>,
}

#[derive(Debug, clap::Subcommand)]
enum Role {
    /// Join the ring at fd 3 (messages [u64; 2]) as consumer, receive N messages, check that
    /// message i is [i, mix(i)], print `received N checksum 0x...`, and exit 0.
    Sink {
        #[arg(long, value_name = "N")]
        count: u64,
        /// Messages taken per call.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        batch: u64,
    },
    /// Join the ring at fd 3 as consumer and the ring at fd 4 as producer (messages [u64; 2]);
    /// answer every [i, x] with [i, x * x] until the sender closes.
    Echo,
}

pub fn run(args: &Args) -> Result<(), String> {
    match args.role {
        Role::Sink { count, batch } => sink(count, batch as usize, args.spin),
        Role::Echo => echo(args.spin),
    }
}

/// splitmix64's output function: the payload expected with message `i`.
pub fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn consumer_at(index: usize) -> Result<Consumer<[u64; 2]>, String> {
    let fd = inherited_fd(index).map_err(|e| e.to_string())?;
    Consumer::join(fd.as_fd()).map_err(|e| format!("joining the ring at fd {}: {e}", index + 3))
}

fn sink(count: u64, batch: usize, spin: Option<u32>) -> Result<(), String> {
    let mut rx = consumer_at(0)?;
    if let Some(spin) = spin {
        rx.set_waiting(Waiting::Spin(spin));
    }
    let mut buffer = vec![[0u64; 2]; batch];
    let mut next = 0u64;
    let mut checksum = 0u64;
    while next < count {
        let received = rx
            .recv_batch_timeout(&mut buffer, PARTNER_TIMEOUT)
            .map_err(|e| format!("after {next} of {count} messages: {e}"))?;
        for &[index, payload] in &buffer[..received] {
            if index != next || payload != mix(index) {
                return Err(format!(
                    "message {next}: expected [{next}, {:#x}], found [{index}, {payload:#x}]",
                    mix(next)
                ));
            }
            checksum = (checksum ^ payload).rotate_left(7).wrapping_add(index);
            next += 1;
        }
    }
    println!("received {count} checksum {checksum:#018x}");
    Ok(())
}

fn echo(spin: Option<u32>) -> Result<(), String> {
    let mut rx = consumer_at(0)?;
    let fd = inherited_fd(1).map_err(|e| e.to_string())?;
    let mut tx =
        Producer::<[u64; 2]>::join(fd.as_fd()).map_err(|e| format!("joining fd 4: {e}"))?;
    if let Some(spin) = spin {
        rx.set_waiting(Waiting::Spin(spin));
        tx.set_waiting(Waiting::Spin(spin));
    }
    println!(
        "[child  pid {}] joined ring A as consumer and ring B as producer",
        std::process::id()
    );
    let mut answered = 0u64;
    loop {
        match rx.recv_timeout(PARTNER_TIMEOUT) {
            Ok([index, value]) => {
                tx.send_timeout([index, value.wrapping_mul(value)], PARTNER_TIMEOUT)
                    .map_err(|e| format!("answering message {index}: {e}"))?;
                answered += 1;
            }
            Err(RecvTimeoutError::Disconnected) => break,
            Err(e) => return Err(format!("after {answered} messages: {e}")),
        }
    }
    println!(
        "[child  pid {}] ring A closed after {answered} messages; all drained, exiting",
        std::process::id()
    );
    Ok(())
}
