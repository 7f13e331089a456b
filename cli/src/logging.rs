//! Logs for the command's long-running parts (the broker): `tracing` events, formatted on the
//! calling thread and handed to a writer thread through a bounded queue, so that logging never
//! blocks the broker. A stalled standard error (a pipe nobody reads) fills the queue; lines past
//! it are dropped and counted, and the writer says how many once it can write again.
//!
//! The level comes from `RUST_LOG`, else `SHMBROKER_LOG` (`error`, `warn`, `info`, `debug`,
//! `trace` or `off`: one level for everything, not `RUST_LOG`'s per-module directives); by
//! default `info` for `serve` and `warn` for every other command. `--log-format json` writes one
//! JSON object per event instead of a line of text.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use tracing::field::{Field, Visit};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// The variables that set the level, the first one set winning.
pub const LEVEL_VARS: [&str; 2] = ["RUST_LOG", "SHMBROKER_LOG"];

/// Lines queued for the writer thread at most.
const QUEUE_LINES: usize = 4096;

/// How events are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Installs the subscriber for this process (once; later calls do nothing), at the level the
/// environment sets or else `default`.
pub fn init(default: LevelFilter, format: Format) -> Result<(), String> {
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
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(writer);
    let _ = match format {
        Format::Text => builder.with_target(false).try_init(),
        Format::Json => builder.event_format(JsonLines).try_init(),
    };
    Ok(())
}

/// Formats each event as one JSON object on one line.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let metadata = event.metadata();
        let mut object = JsonObject(String::with_capacity(160));
        object.string("timestamp", &rfc3339(std::time::SystemTime::now()));
        object.string("level", metadata.level().as_str());
        object.string("target", metadata.target());
        event.record(&mut object);
        writeln!(writer, "{{{}}}", object.0)
    }
}

/// The members of a JSON object, written as fields arrive.
struct JsonObject(String);

impl JsonObject {
    fn key(&mut self, key: &str) {
        if !self.0.is_empty() {
            self.0.push(',');
        }
        escape_into(&mut self.0, key);
        self.0.push(':');
    }

    fn string(&mut self, key: &str, value: &str) {
        self.key(key);
        escape_into(&mut self.0, value);
    }

    fn raw(&mut self, key: &str, value: impl std::fmt::Display) {
        use std::fmt::Write as _;
        self.key(key);
        let _ = write!(self.0, "{value}");
    }
}

impl Visit for JsonObject {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.string(field.name(), &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.string(field.name(), value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.raw(field.name(), value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.raw(field.name(), value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field.name(), value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.raw(field.name(), value);
        } else {
            self.string(field.name(), &value.to_string());
        }
    }
}

/// `text` as a JSON string, quotes included.
fn escape_into(out: &mut String, text: &str) {
    use std::fmt::Write as _;
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `time` in UTC as RFC 3339 with milliseconds (`2026-11-23T09:14:03.512Z`).
pub fn rfc3339(time: std::time::SystemTime) -> String {
    let since = time
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = since.as_secs();
    let (year, month, day) = civil_from_days(seconds / 86_400);
    let of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
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

#[cfg(test)]
mod tests {
    use super::{civil_from_days, escape_into, rfc3339};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn dates_are_the_calendar_s() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        // 2000-02-29 (a leap day of a year divisible by 400) and 2100-03-01 (2100 is no leap year).
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(47_541), (2100, 3, 1));
        let time = UNIX_EPOCH + Duration::from_millis(1_795_431_243_512);
        assert_eq!(rfc3339(time), "2026-11-23T10:54:03.512Z");
    }

    #[test]
    fn json_strings_escape_what_they_must() {
        let mut out = String::new();
        escape_into(&mut out, "a \"b\"\\\n\u{1}é");
        assert_eq!(out, r#""a \"b\"\\\n\u0001é""#);
    }
}
