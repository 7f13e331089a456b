//! An Agave-style scheduler on typed channels: rank 0 streams `#[repr(C)]` work records to its
//! workers, each on a channel of its own, and takes their results back on another; a record
//! carries its transaction's bytes by reference, as a loan the scheduler filled (Agave's
//! `SharableTransactionRegion`), so only 32 bytes travel per transaction. Every result is checked.
//!
//! ```text
//! cargo run --example scheduler
//! ```

mod common;

use bytemuck::{Pod, Zeroable};
use shmbroker::Session;
use shmbroker::bindings::PayloadRef;
use std::error::Error;
use std::time::Instant;

/// The scheduler to a worker: a batch of transactions, by reference.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
struct PackToWorker {
    /// The first transaction's id; the batch holds `count` consecutive ones.
    first: u64,
    count: u32,
    /// Bytes per transaction in the region.
    size: u32,
    /// Where the batch's bytes are: a loan of the scheduler's, lent to this worker.
    region: PayloadRef,
}

/// A worker to the scheduler: what it made of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
struct WorkerToPack {
    first: u64,
    count: u32,
    _pad: u32,
    /// A checksum of every transaction's bytes, as the worker read them in place.
    checksum: u64,
    worker: u64,
}

const BATCHES: u64 = 2000;
const PER_BATCH: u32 = 16;
const SIZE: u32 = 256;
const TAG_WORK: u64 = 0xa6a7e;

fn main() -> std::process::ExitCode {
    common::run(schedule)
}

/// The bytes of transaction `id`.
fn transaction(id: u64, out: &mut [u8]) {
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = (id as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn schedule(session: &mut Session) -> Result<(), Box<dyn Error>> {
    let rank = session.rank();
    let workers = session.world_size() - 1;
    if rank == 0 {
        let mut to: Vec<_> = (1..=workers)
            .map(|w| session.channel_to::<PackToWorker>(w, TAG_WORK, 1024))
            .collect::<Result<_, _>>()?;
        let mut from: Vec<_> = (1..=workers)
            .map(|w| session.channel_from::<WorkerToPack>(w, TAG_WORK))
            .collect::<Result<_, _>>()?;
        let started = Instant::now();
        let mut expected = std::collections::VecDeque::new();
        for batch in 0..BATCHES {
            let worker = (batch % u64::from(workers)) as usize;
            let first = batch * u64::from(PER_BATCH);
            // The batch's bytes in a loan: the worker reads them in place.
            let mut loan = session.loan((PER_BATCH * SIZE) as usize)?;
            let mut sum = 0xcbf2_9ce4_8422_2325u64;
            for (k, chunk) in loan.chunks_mut(SIZE as usize).enumerate() {
                transaction(first + k as u64, chunk);
            }
            sum ^= checksum(&loan);
            // Lent to the worker by reference, which the record carries: 32 bytes per batch.
            let region = session.lend_ref(worker as u32 + 1, loan)?;
            to[worker].send(&PackToWorker {
                first,
                count: PER_BATCH,
                size: SIZE,
                region,
            })?;
            expected.push_back((worker, first, sum));
        }
        for (worker, first, sum) in expected {
            let result = from[worker].recv()?;
            if result.first != first || result.checksum != sum || result.worker != worker as u64 + 1
            {
                return Err(format!(
                    "worker {}'s result for batch at {first} is wrong: {result:?}",
                    worker + 1
                )
                .into());
            }
        }
        let elapsed = started.elapsed();
        println!(
            "rank 0: {} transactions in {BATCHES} batches to {workers} workers, every result \
             checked ({:.0} batches a second)",
            BATCHES * u64::from(PER_BATCH),
            BATCHES as f64 / elapsed.as_secs_f64()
        );
    } else {
        let mut work = session.channel_from::<PackToWorker>(0, TAG_WORK)?;
        let mut results = session.channel_to::<WorkerToPack>(0, TAG_WORK, 1024)?;
        let mine = (0..BATCHES)
            .filter(|b| b % u64::from(workers) == u64::from(rank - 1))
            .count();
        for _ in 0..mine {
            let record = work.recv()?;
            // The transactions, read where the scheduler wrote them; dropping the view gives
            // them back.
            let view = session.view_loan_ref(0, record.region)?;
            if view.len() != (record.count * record.size) as usize {
                return Err("a region of the wrong size".into());
            }
            let checksum = 0xcbf2_9ce4_8422_2325 ^ checksum(&view);
            results.send(&WorkerToPack {
                first: record.first,
                count: record.count,
                _pad: 0,
                checksum,
                worker: u64::from(rank),
            })?;
        }
    }
    Ok(())
}
