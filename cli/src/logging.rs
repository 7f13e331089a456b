//! Logs for the command's long-running parts (the broker): `tracing` events, formatted on the
//! calling thread and handed to a writer thread through a bounded queue, so that logging never
//! blocks the broker. A stalled standard error (a pipe nobody reads) fills the queue; lines past
//! it are dropped and counted, and the writer says how many once it can write again.
//!
//! The level comes from `RUST_LOG`, else `SHMBROKER_LOG` (`error`, `warn`, `info`, `debug`,
//! `trace` or `off`: one level for everything, not `RUST_LOG`'s per-module directives); by
//! default `info` for `serve` and `warn` for every other command.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The variables that set the level, the first one set winning.
pub const LEVEL_VARS: [&str; 2] = ["RUST_LOG", "SHMBROKER_LOG"];

/// Lines queued for the writer thread at most.
const QUEUE_LINES: usize = 4096;

/// Installs the subscriber for this process (once; later calls do nothing), at the level the
/// environment sets or else `default`.
pub fn init(default: LevelFilter) -> Result<(), String> {
    let set = LEVEL_VARS
        .iter()
        .find_map(|&var| Some((var, std::env::var(var).ok()?)));
    let level = match set {
        None => default,
        Some((var, value)) => value.trim().parse::<LevelFilter>().map_err(|_| {
            format!("{var} must be error, warn, info, debug, trace or off, not {value:?}")
        })?,
    };
    let (sender, receiver) = sync_channel(QUEUE_LINES);
    let dropped = Arc::new(AtomicU64::new(0));
    let writer = NonBlocking {
        sender,
        dropped: Arc::clone(&dropped),
    };
    std::thread::Builder::new()
        .name("shmbroker-log".into())
        .spawn(move || write_lines(&receiver, &dropped))
        .map_err(|e| format!("starting the log thread: {e}"))?;
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(writer)
        .with_target(false)
        .try_init();
    Ok(())
}

/// Lines queued and not yet written.
static QUEUED: AtomicU64 = AtomicU64::new(0);

/// Waits up to `timeout` for the queued lines to be written (before the process exits).
pub fn drain(timeout: std::time::Duration) {
    let until = std::time::Instant::now() + timeout;
    while QUEUED.load(Ordering::Acquire) > 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Writes queued lines to standard error, and how many were dropped whenever some were.
fn write_lines(receiver: &Receiver<Vec<u8>>, dropped: &AtomicU64) {
    let mut stderr = std::io::stderr();
    while let Ok(line) = receiver.recv() {
        let _ = stderr.write_all(&line);
        QUEUED.fetch_sub(1, Ordering::AcqRel);
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            let _ = writeln!(
                stderr,
                "shmbroker: {lost} log lines dropped: standard error was not keeping up"
            );
        }
    }
}

/// Hands each formatted event to the writer thread, or drops it when the queue is full.
#[derive(Clone)]
struct NonBlocking {
    sender: SyncSender<Vec<u8>>,
    dropped: Arc<AtomicU64>,
}

/// One event's bytes, sent as one line when the formatter is done with it.
struct Line {
    bytes: Vec<u8>,
    out: NonBlocking,
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.bytes.is_empty() {
            return;
        }
        QUEUED.fetch_add(1, Ordering::AcqRel);
        match self.out.sender.try_send(std::mem::take(&mut self.bytes)) {
            Ok(()) => {}
            Err(TrySendError::Disconnected(_)) => {
                QUEUED.fetch_sub(1, Ordering::AcqRel);
            }
            Err(TrySendError::Full(_)) => {
                QUEUED.fetch_sub(1, Ordering::AcqRel);
                self.out.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl<'a> MakeWriter<'a> for NonBlocking {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            bytes: Vec::with_capacity(160),
            out: self.clone(),
        }
    }
}
