//! Loom models of the ring protocol (see the `ring` and `futex` module docs for the arguments).
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p shmbroker-queues --lib loom`.
//! Each test names the property it checks. A lost wake-up shows up as a loom deadlock ("all threads
//! blocked"), a data race on a slot as a loom causality violation, and a wrong value as a failed
//! assertion.

use crate::Waiting;
use crate::readiness::{ModelEventFd, ReadyRings, ReadySet};
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
        tx.set_waiting(Waiting::Spin(0));
        rx.set_waiting(Waiting::Spin(0));
        let producer = thread::spawn(move || {
            tx.send_timeout(1, FOREVER).unwrap();
            tx.send_timeout(2, FOREVER).unwrap();
        });
        assert_eq!(rx.recv_timeout(FOREVER), Ok(1));
        assert_eq!(rx.recv_timeout(FOREVER), Ok(2));
        producer.join().unwrap();
    });
}

/// Release in batches loses no wake-up and no message: a consumer keeping up to 2 read slots
/// of 8 while the next message is there, against a producer that fills the ring and parks on it
/// (nothing spins). The producer's tenth message needs slots the consumer keeps until it has
/// read on.
#[test]
fn loom_slots_released_in_batches_wake_a_parked_producer() {
    loom::model(|| {
        let (mut tx, mut rx) = pair::<u64>(8).unwrap();
        tx.set_waiting(Waiting::Spin(0));
        rx.set_waiting(Waiting::Spin(0));
        rx.set_release_batch(2);
        for value in 0..8 {
            tx.try_send(value).unwrap();
        }
        let producer = thread::spawn(move || {
            tx.send_timeout(8, FOREVER).unwrap();
            tx.send_timeout(9, FOREVER).unwrap();
        });
        for value in 0..10 {
            assert_eq!(rx.recv_timeout(FOREVER), Ok(value));
        }
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
        rx.set_waiting(Waiting::Spin(0));
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
        tx.set_waiting(Waiting::Spin(0));
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
        rx.set_waiting(Waiting::Spin(0));
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
        tx.set_waiting(Waiting::Spin(0));
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
    rx.set_waiting(Waiting::Spin(0));
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

/// Rings on one eventfd, as a session's rings from its peers: the waiter's side of the
/// readiness protocol is the shipped [`ReadySet`], driven through this [`ReadyRings`]. A ring
/// whose producer has gone and left nothing is dropped from the wait, as a session stops waiting
/// for a peer that is gone, but is still disarmed with the others.
struct ModelRings {
    set: ReadySet,
    rings: Vec<crate::Consumer<u64>>,
    gone: Vec<bool>,
    event: std::sync::Arc<ModelEventFd>,
}

impl ModelRings {
    /// Consumers of fresh rings of `capacities`, and their producers, all on one eventfd.
    fn new(capacities: &[usize]) -> (Self, Vec<crate::Producer<u64>>) {
        let event = std::sync::Arc::new(ModelEventFd::default());
        let mut producers = Vec::new();
        let mut rings = Vec::new();
        for &capacity in capacities {
            let (mut tx, mut rx) = pair::<u64>(capacity).unwrap();
            tx.set_notify(event.clone());
            rx.set_notify(event.clone());
            producers.push(tx);
            rings.push(rx);
        }
        let gone = vec![false; rings.len()];
        let set = ReadySet::new();
        (
            Self {
                set,
                rings,
                gone,
                event,
            },
            producers,
        )
    }

    /// Waits as a session's `recv_any` does (`wait_for_sender`): find or arm, sleep on the
    /// eventfd, re-arm and reset it, over again. Returns the ring found.
    fn wait(&mut self) -> usize {
        loop {
            if let Some(ring) = ReadySet::find_or_arm(self).unwrap() {
                return ring;
            }
            self.event.wait_readable();
            ReadySet::woke(self).unwrap();
        }
    }

    /// Takes a message from `ring`, which a look found; a closed ring is gone from the wait.
    fn take(&mut self, ring: usize) -> Option<u64> {
        match self.rings[ring].try_recv() {
            Ok(value) => Some(value),
            Err(TryRecvError::Disconnected) => {
                self.gone[ring] = true;
                None
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
}

impl ReadyRings for ModelRings {
    type Message = u64;
    type Found = usize;
    type Error = std::convert::Infallible;

    fn ready_set(&mut self) -> &mut ReadySet {
        &mut self.set
    }

    fn each_ring(&mut self, mut f: impl FnMut(&crate::Consumer<u64>)) -> Result<(), Self::Error> {
        for (ring, gone) in self.rings.iter().zip(&self.gone) {
            if !gone {
                f(ring);
            }
        }
        Ok(())
    }

    fn each_registered(&mut self, f: impl FnMut(&crate::Consumer<u64>)) {
        self.rings.iter().for_each(f);
    }

    fn has_buffered(&mut self) -> bool {
        false
    }

    fn look(&mut self) -> Result<Option<usize>, Self::Error> {
        Ok((0..self.rings.len()).find(|&ring| !self.gone[ring] && self.rings[ring].has_pending()))
    }

    fn drain(&mut self) -> u64 {
        self.event.drain()
    }
}

/// No lost wake-up on the readiness path: one consumer waits on one eventfd for two rings, each
/// fed by its own producer thread, and receives both messages. A lost signal shows as a loom
/// deadlock (the consumer asleep on a count nobody will raise).
#[test]
fn loom_readiness_never_misses_a_message() {
    loom::model(|| {
        let (mut rings, producers) = ModelRings::new(&[1, 1]);
        let senders: Vec<_> = producers
            .into_iter()
            .zip([1, 2])
            .map(|(mut tx, value)| thread::spawn(move || tx.try_send(value).unwrap()))
            .collect();
        let mut got = Vec::new();
        while got.len() < 2 {
            let ring = rings.wait();
            got.extend(rings.take(ring));
        }
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        for sender in senders {
            sender.join().unwrap();
        }
    });
}

/// No lost wake-up for an event loop: a consumer looks without blocking (`try_recv_any`, which
/// is [`ReadySet::try_next`]) and, finding nothing, waits on the eventfd itself (`poll`, `epoll`,
/// an async runtime), receiving three messages from two producers. A look resets the eventfd's
/// count when wakers owe it, and a signal that reset reads back may belong to a message the look
/// has not seen; without the look after the reset, loom finds that lost wake-up as a deadlock.
#[test]
fn loom_readiness_look_then_wait_never_misses_a_message() {
    loom::model(|| {
        let (mut rings, producers) = ModelRings::new(&[2, 1]);
        let [mut tx_a, mut tx_b] = <[_; 2]>::try_from(producers).unwrap();
        let a = thread::spawn(move || {
            tx_a.try_send(1).unwrap();
            tx_a.try_send(2).unwrap();
            tx_a
        });
        let b = thread::spawn(move || {
            tx_b.try_send(3).unwrap();
            tx_b
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            match ReadySet::try_next(&mut rings).unwrap() {
                Some(ring) => got.extend(rings.take(ring)),
                None => rings.event.wait_readable(),
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
        let (mut rings, producers) = ModelRings::new(&[1]);
        let producer = thread::spawn(move || drop(producers));
        let ring = rings.wait();
        assert_eq!(rings.take(ring), None);
        producer.join().unwrap();
    });
}
