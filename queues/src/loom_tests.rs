//! Loom models of the ring protocol (see the `ring` and `futex` module docs for the arguments).
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p shmbroker-queues --lib loom`.
//! Each test names the property it checks. A lost wake-up shows up as a loom deadlock ("all threads
//! blocked"), a data race on a slot as a loom causality violation, and a wrong value as a failed
//! assertion.

use crate::readiness::ModelEventFd;
use crate::{RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError, pair};
use loom::thread;
use std::time::Duration;

/// Blocking calls in these tests wait without a deadline: loom itself reports a wait that never ends.
const FOREVER: Duration = Duration::MAX;

/// FIFO order without loss or duplication across wrap-around: 3 messages through 2 slots, the
/// producer retrying on `Full` and the consumer on `Empty` (pure spinning, no parking).
#[test]
fn loom_fifo_across_wrap_around_spinning() {
    loom::model(|| {
        let (mut tx, mut rx) = pair::<u64>(2).unwrap();
        let producer = thread::spawn(move || {
            for value in 1..=3 {
                loop {
                    match tx.try_send(value) {
                        Ok(()) => break,
                        Err(TrySendError::Full(_)) => thread::yield_now(),
                        Err(other) => panic!("unexpected {other:?}"),
                    }
                }
            }
        });
        let mut received = Vec::new();
        while received.len() < 3 {
            match rx.try_recv() {
                Ok(value) => received.push(value),
                Err(TryRecvError::Empty) => thread::yield_now(),
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(received, [1, 2, 3]);
        producer.join().unwrap();
    });
}

/// No lost wake-up, both directions: with spinning disabled, a consumer parked on an empty ring
/// and a producer parked on a full one (1 slot, 2 messages) are always woken.
#[test]
fn loom_parked_producer_and_consumer_are_woken() {
    loom::model(|| {
        let (mut tx, mut rx) = pair::<u64>(1).unwrap();
        tx.set_spin_limit(0);
        rx.set_spin_limit(0);
        let producer = thread::spawn(move || {
            tx.send_timeout(1, FOREVER).unwrap();
            tx.send_timeout(2, FOREVER).unwrap();
        });
        assert_eq!(rx.recv_timeout(FOREVER), Ok(1));
        assert_eq!(rx.recv_timeout(FOREVER), Ok(2));
        producer.join().unwrap();
    });
}

/// Full and empty boundaries: with 2 slots, a third message is refused until the consumer frees a
/// slot, and the consumer never sees more messages than were sent.
#[test]
fn loom_full_and_empty_boundaries() {
    loom::model(|| {
        let (mut tx, mut rx) = pair::<u64>(2).unwrap();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert_eq!(tx.try_send(3), Err(TrySendError::Full(3)));
        let consumer = thread::spawn(move || {
            assert_eq!(rx.try_recv(), Ok(1));
            rx
        });
        // Racing with the consumer: either still full or the freed slot takes message 3.
        let third_sent = match tx.try_send(3) {
            Ok(()) => true,
            Err(TrySendError::Full(3)) => false,
            Err(other) => panic!("unexpected {other:?}"),
        };
        let mut rx = consumer.join().unwrap();
        assert_eq!(rx.try_recv(), Ok(2));
        if third_sent {
            assert_eq!(rx.try_recv(), Ok(3));
        }
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    });
}

/// A batch is published by one store: a concurrent consumer sees none of it or all of it.
#[test]
fn loom_batch_is_published_whole() {
    loom::model(|| {
        let (mut tx, mut rx) = pair::<u64>(2).unwrap();
        let producer = thread::spawn(move || {
            assert_eq!(tx.try_send_batch(&[10, 20]), Ok(2));
            tx
        });
        let mut buffer = [0; 2];
        match rx.try_recv_batch(&mut buffer) {
            Ok(count) => {
                assert_eq!(count, 2, "saw part of a batch");
                assert_eq!(buffer, [10, 20]);
            }
            Err(TryRecvError::Empty) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
        drop(producer.join().unwrap());
    });
}

/// Close racing with receive: everything sent before the producer dropped is received, in order,
/// and only then does a parked consumer get `Disconnected`.
#[test]
fn loom_consumer_drains_then_sees_close() {
    loom::model(|| {
        let (mut tx, mut rx) = pair::<u64>(2).unwrap();
        rx.set_spin_limit(0);
        let producer = thread::spawn(move || {
            tx.try_send(1).unwrap();
            tx.try_send(2).unwrap();
            drop(tx);
        });
        assert_eq!(rx.recv_timeout(FOREVER), Ok(1));
        assert_eq!(rx.recv_timeout(FOREVER), Ok(2));
        assert_eq!(
            rx.recv_timeout(FOREVER),
            Err(RecvTimeoutError::Disconnected)
        );
        producer.join().unwrap();
    });
}

/// Close racing with send: a producer parked on a full ring is woken by the consumer's drop and
/// gets `Disconnected`, with the count of what it sent.
#[test]
fn loom_parked_producer_sees_consumer_close() {
    loom::model(|| {
        let (mut tx, rx) = pair::<u64>(1).unwrap();
        tx.set_spin_limit(0);
        let consumer = thread::spawn(move || drop(rx));
        match tx.send_batch_timeout(&[1, 2], FOREVER) {
            // The first message fits before or after the close; the second never can.
            Err(SendTimeoutError::Disconnected(sent)) => assert!(sent <= 1),
            other => panic!("unexpected {other:?}"),
        }
        consumer.join().unwrap();
    });
}

/// A third party closing the ring (the broker, for a dead peer) wakes a consumer parked on an
/// empty ring: it drains what was sent, then gets `Disconnected`, never sleeps on, and then sees
/// the cause the closer gave.
#[test]
fn loom_a_third_party_close_wakes_a_parked_consumer() {
    loom::model(|| {
        let (mut tx, mut rx, closer) = crate::ring::pair_with_closer::<u64>(2);
        rx.set_spin_limit(0);
        tx.try_send(7).unwrap();
        let broker = thread::spawn(move || closer.close(3));
        assert_eq!(rx.recv_timeout(FOREVER), Ok(7));
        assert_eq!(
            rx.recv_timeout(FOREVER),
            Err(RecvTimeoutError::Disconnected)
        );
        // The cause was stored before the close that the consumer saw.
        assert_eq!(rx.close_cause(), Some(3));
        broker.join().unwrap();
        drop(tx);
    });
}

/// A third party closing the ring wakes a producer parked on a full ring with `Disconnected`.
#[test]
fn loom_a_third_party_close_wakes_a_parked_producer() {
    loom::model(|| {
        let (mut tx, rx, closer) = crate::ring::pair_with_closer::<u64>(1);
        tx.set_spin_limit(0);
        tx.try_send(1).unwrap();
        let broker = thread::spawn(move || closer.close(0));
        assert_eq!(
            tx.send_timeout(2, FOREVER),
            Err(SendTimeoutError::Disconnected(2))
        );
        assert_eq!(tx.close_cause(), Some(0));
        broker.join().unwrap();
        drop(rx);
    });
}

/// A one-slot ring whose consumer parks at once and holds an interrupt, with a closer of it.
fn interruptible_pair() -> (
    crate::Producer<u64>,
    crate::Consumer<u64>,
    crate::Closer<u64>,
    std::sync::Arc<crate::Interrupt>,
) {
    let (tx, mut rx, closer) = crate::ring::pair_with_closer::<u64>(1);
    let interrupt = std::sync::Arc::new(crate::Interrupt::new());
    rx.set_interrupt(std::sync::Arc::clone(&interrupt));
    rx.set_spin_limit(0);
    (tx, rx, closer, interrupt)
}

/// An interrupt fired from another thread (as a session's watcher does when a third rank dies)
/// wakes a consumer parked on an empty ring with `Interrupted`, and leaves the ring open: a
/// message sent afterwards is still received.
#[test]
fn loom_an_interrupt_wakes_a_parked_consumer() {
    loom::model(|| {
        let (mut tx, mut rx, closer, interrupt) = interruptible_pair();
        let seen = interrupt.generation();
        let watcher = thread::spawn(move || interrupt.fire([&closer]));
        let mut one = [0u64];
        assert_eq!(
            rx.recv_batch_interruptible(&mut one, FOREVER, seen),
            Err(RecvTimeoutError::Interrupted)
        );
        watcher.join().unwrap();
        tx.try_send(5).unwrap();
        assert_eq!(rx.recv_timeout(FOREVER), Ok(5));
    });
}

/// A message and an interrupt racing: the wait ends either way, and the message is never lost
/// (received by the wait, or still in the ring for the next call).
#[test]
fn loom_an_interrupt_never_loses_a_message() {
    loom::model(|| {
        let (mut tx, mut rx, closer, interrupt) = interruptible_pair();
        let seen = interrupt.generation();
        let producer = thread::spawn(move || {
            tx.try_send(9).unwrap();
            tx
        });
        let watcher = thread::spawn(move || interrupt.fire([&closer]));
        let mut one = [0u64];
        match rx.recv_batch_interruptible(&mut one, FOREVER, seen) {
            Ok(1) => assert_eq!(one[0], 9),
            Err(RecvTimeoutError::Interrupted) => assert_eq!(rx.recv_timeout(FOREVER), Ok(9)),
            other => panic!("unexpected {other:?}"),
        }
        watcher.join().unwrap();
        drop(producer.join().unwrap());
    });
}

/// Waits, as a session's `recv_any` does, for whichever of `consumers` has something: arm every
/// ring, re-check, sleep on the eventfd, disarm, reset the eventfd if it slept or a waker fired.
fn wait_for_any(consumers: &[&crate::Consumer<u64>], event: &crate::readiness::ModelEventFd) {
    loop {
        let mut pending = false;
        for consumer in consumers {
            pending |= consumer.arm();
        }
        if !pending {
            event.wait_readable();
        }
        let mut fired = !pending;
        for consumer in consumers {
            fired |= consumer.disarm();
        }
        if fired {
            event.drain();
        }
        if consumers.iter().any(|consumer| consumer.has_pending()) {
            return;
        }
    }
}

/// No lost wake-up on the readiness path: one consumer waits on one eventfd for two rings, each
/// fed by its own producer thread, and receives both messages. A lost signal shows as a loom
/// deadlock (the consumer asleep on a count nobody will raise).
#[test]
fn loom_readiness_never_misses_a_message() {
    loom::model(|| {
        let event = std::sync::Arc::new(crate::readiness::ModelEventFd::default());
        let (mut tx_a, mut rx_a) = pair::<u64>(1).unwrap();
        let (mut tx_b, mut rx_b) = pair::<u64>(1).unwrap();
        for tx in [&mut tx_a, &mut tx_b] {
            tx.set_notify(event.clone());
        }
        rx_a.set_notify(event.clone());
        rx_b.set_notify(event.clone());
        let a = thread::spawn(move || tx_a.try_send(1).unwrap());
        let b = thread::spawn(move || tx_b.try_send(2).unwrap());
        // A ring whose producer has gone and left nothing is dropped from the wait, as a session
        // stops waiting for a peer that is gone.
        let mut live = vec![rx_a, rx_b];
        let mut got = Vec::new();
        while got.len() < 2 {
            wait_for_any(&live.iter().collect::<Vec<_>>(), &event);
            live.retain_mut(|rx| match rx.try_recv() {
                Ok(value) => {
                    got.push(value);
                    true
                }
                Err(TryRecvError::Empty) => true,
                Err(TryRecvError::Disconnected) => false,
                Err(other) => panic!("unexpected {other:?}"),
            });
        }
        a.join().unwrap();
        b.join().unwrap();
    });
}

/// What a session's `try_recv_any` keeps between looks: whether its rings are armed, and how
/// many writes wakers owe the eventfd (registrations they took, less what resets read back).
#[derive(Default)]
struct Looker {
    armed: bool,
    owed: i64,
}

impl Looker {
    /// One non-blocking look, as `try_recv_any` makes it: true when a ring has something (every
    /// ring disarmed); false with every ring armed, after which the caller may wait on the
    /// eventfd.
    ///
    /// A look that owes the eventfd a reset makes it after arming, and then arms and looks once
    /// more, making no second reset. The reset may read back the write of a waker that took an
    /// arming of this very look (for a message the look did not see, or for one it already
    /// took, while the same producer's next message follows with no write, the registration
    /// being taken): the second arming gives such a ring a registration again, and a message
    /// published before it is seen, one after it writes the eventfd anew.
    fn look(&mut self, consumers: &[&crate::Consumer<u64>], event: &ModelEventFd) -> bool {
        if self.found(consumers) {
            return true;
        }
        if self.arm(consumers) && self.found(consumers) {
            return true;
        }
        if self.owed > 0 {
            self.owed -= i64::try_from(event.drain()).unwrap();
            return self.arm(consumers) && self.found(consumers);
        }
        false
    }

    /// Arms every ring not armed (counting the registrations wakers took); whether any ring
    /// has something.
    fn arm(&mut self, consumers: &[&crate::Consumer<u64>]) -> bool {
        let mut pending = false;
        for consumer in consumers {
            if !self.armed || !consumer.is_armed() {
                self.owed += i64::from(self.armed && consumer.disarm());
                pending |= consumer.arm();
            } else {
                pending |= consumer.has_pending();
            }
        }
        self.armed = true;
        pending
    }

    /// Whether a ring has something; if one has, every ring is disarmed (counting the
    /// registrations wakers took).
    fn found(&mut self, consumers: &[&crate::Consumer<u64>]) -> bool {
        if !consumers.iter().any(|consumer| consumer.has_pending()) {
            return false;
        }
        if self.armed {
            self.armed = false;
            for consumer in consumers {
                self.owed += i64::from(consumer.disarm());
            }
        }
        true
    }
}

/// No lost wake-up for an event loop: a consumer looks without blocking (`try_recv_any`) and,
/// finding nothing, waits on the eventfd itself (`poll`, `epoll`, an async runtime), receiving
/// three messages from two producers. A look resets the eventfd's count when wakers owe it, and
/// a signal that reset reads back may belong to a message the look has not seen; without the
/// look after the reset, loom finds that lost wake-up as a deadlock.
#[test]
fn loom_readiness_look_then_wait_never_misses_a_message() {
    loom::model(|| {
        let event = std::sync::Arc::new(ModelEventFd::default());
        let (mut tx_a, mut rx_a) = pair::<u64>(2).unwrap();
        let (mut tx_b, mut rx_b) = pair::<u64>(1).unwrap();
        for tx in [&mut tx_a, &mut tx_b] {
            tx.set_notify(event.clone());
        }
        rx_a.set_notify(event.clone());
        rx_b.set_notify(event.clone());
        let a = thread::spawn(move || {
            tx_a.try_send(1).unwrap();
            tx_a.try_send(2).unwrap();
            tx_a
        });
        let b = thread::spawn(move || {
            tx_b.try_send(3).unwrap();
            tx_b
        });
        let mut looker = Looker::default();
        let mut got = Vec::new();
        while got.len() < 3 {
            if !looker.look(&[&rx_a, &rx_b], &event) {
                event.wait_readable();
                continue;
            }
            for rx in [&mut rx_a, &mut rx_b] {
                if let Ok(value) = rx.try_recv() {
                    got.push(value);
                }
            }
        }
        got.sort_unstable();
        assert_eq!(got, [1, 2, 3]);
        drop(a.join().unwrap());
        drop(b.join().unwrap());
    });
}

/// A producer that goes away while the consumer sleeps on the eventfd wakes it: the close takes
/// the same waker path as a message.
#[test]
fn loom_readiness_wakes_on_close() {
    loom::model(|| {
        let event = std::sync::Arc::new(crate::readiness::ModelEventFd::default());
        let (mut tx, mut rx) = pair::<u64>(1).unwrap();
        tx.set_notify(event.clone());
        rx.set_notify(event.clone());
        let producer = thread::spawn(move || drop(tx));
        wait_for_any(&[&rx], &event);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        producer.join().unwrap();
    });
}
