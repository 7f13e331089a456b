//! Where the library's log events go, for programs that have no `tracing` subscriber of their
//! own: the C ABI (`shmbroker_set_log`) and the Python package (the `logging` logger
//! `shmbroker`) send them here.
//!
//! The library logs through [`tracing`], and a Rust program chooses where that goes with a
//! subscriber of its own (`tracing-subscriber`, say). [`set_sink`] installs one process-wide
//! subscriber, once, that turns each event into one line (its message, then its fields as
//! `name=value`) and hands it to a [`Sink`] that can be replaced or removed at any time.
//!
//! Events are rare: a fallback of the fd transport, the broker's logons, departures and deaths,
//! a refused notice. None is on a message's path. A sink is called on whichever thread logged
//! (the caller's, a watcher thread, the broker's threads), possibly on several at once, and must
//! return promptly: a broker thread waits for it.

use crate::Error;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use tracing::field::{Field, Visit};
use tracing::span;
use tracing::{Event, Metadata, Subscriber};

/// How severe an event is, most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Something failed.
    Error = 1,
    /// Something went wrong and was worked around (the fd relay instead of `pidfd_getfd`).
    Warn = 2,
    /// What the broker and sessions did (logons, departures, the fd transport).
    Info = 3,
    /// Details for debugging shmbroker.
    Debug = 4,
    /// More details.
    Trace = 5,
}

impl Level {
    fn of(level: tracing::Level) -> Self {
        match level {
            tracing::Level::ERROR => Self::Error,
            tracing::Level::WARN => Self::Warn,
            tracing::Level::INFO => Self::Info,
            tracing::Level::DEBUG => Self::Debug,
            tracing::Level::TRACE => Self::Trace,
        }
    }
}

/// Where events go: called with each event's level, its target (the module that logged it,
/// `shmbroker_handshake::broker::liveness` say) and its line.
pub type Sink = Box<dyn Fn(Level, &str, &str) + Send + Sync>;

/// The sink and the most detailed level it takes (0: none).
struct Forwarder {
    sink: RwLock<Option<Arc<Sink>>>,
    max: AtomicU8,
}

static FORWARDER: OnceLock<Result<&'static Forwarder, String>> = OnceLock::new();

/// Sends every later event at `max` or more severe to `sink`, or none with `None`, replacing what
/// an earlier call set. The first call installs this module's subscriber for the whole process.
///
/// # Errors
///
/// [`Error::Misuse`] when the process already has another global `tracing` subscriber (its
/// events go there; this call changes nothing).
pub fn set_sink(max: Level, sink: Option<Sink>) -> Result<(), Error> {
    let forwarder = FORWARDER
        .get_or_init(|| {
            let forwarder: &'static Forwarder = Box::leak(Box::new(Forwarder {
                sink: RwLock::new(None),
                max: AtomicU8::new(0),
            }));
            tracing::subscriber::set_global_default(Subscribed(forwarder))
                .map(|()| forwarder)
                .map_err(|_| {
                    "this process already has a tracing subscriber; the library's events go \
                     there"
                        .to_string()
                })
        })
        .as_ref()
        .map_err(|why| Error::Misuse(why.clone()))?;
    let level = if sink.is_some() { max as u8 } else { 0 };
    *forwarder
        .sink
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = sink.map(Arc::new);
    forwarder.max.store(level, Ordering::Release);
    Ok(())
}

/// The installed subscriber: keeps no spans, and passes events on to the sink.
struct Subscribed(&'static Forwarder);

impl Subscriber for Subscribed {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // Asked every time: the level can change (`enabled` is one atomic load).
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event()
            && Level::of(*metadata.level()) as u8 <= self.0.max.load(Ordering::Acquire)
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let sink = self
            .0
            .sink
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let Some(sink) = sink else { return };
        let mut line = Line::default();
        event.record(&mut line);
        let metadata = event.metadata();
        sink(
            Level::of(*metadata.level()),
            metadata.target(),
            &line.finish(),
        );
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

/// An event's message, then its other fields as ` name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Line {
    fn finish(mut self) -> String {
        if !self.fields.is_empty() {
            self.message.push_str(" (");
            self.message.push_str(self.fields.trim_start());
            self.message.push(')');
        }
        self.message
    }
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn events_reach_the_sink_as_lines_at_its_level_and_stop_when_it_is_removed() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&lines);
        set_sink(
            Level::Info,
            Some(Box::new(move |level, target, line| {
                kept.lock()
                    .unwrap()
                    .push((level, target.to_owned(), line.to_owned()));
            })),
        )
        .unwrap();
        tracing::warn!(rank = 2, pid = 77, "fd transport: {}", "relay");
        tracing::debug!(rank = 2, "too detailed for Info");
        set_sink(Level::Info, None).unwrap();
        tracing::warn!("after the sink was removed");
        let lines = lines.lock().unwrap();
        assert_eq!(
            *lines,
            [(
                Level::Warn,
                "shmbroker::logging::tests".to_owned(),
                "fd transport: relay (rank=2 pid=77)".to_owned()
            )]
        );
    }
}
