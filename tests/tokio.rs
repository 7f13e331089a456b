//! `AsyncReceiver` (the `tokio` feature) with real worker processes: a farm served from one
//! task, a worker killed with answers unread, a deadline that leaves the runtime's thread free,
//! and the call made outside a runtime.

use shmbroker::Error;
use shmbroker::session::Session;
use std::process::Stdio;
use std::time::Duration;

mod common;

use common::{Broker, farm_worker, farm_worker_with, fnv1a, task};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn reader(broker: &Broker) -> Session {
    let mut reader = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    reader.set_timeout(Duration::from_secs(30));
    reader
}

#[test]
fn one_task_serves_a_farm_of_worker_processes() {
    let broker = Broker::start("tokio-farm", 4);
    let children: Vec<_> = (1..=3)
        .map(|rank| farm_worker(&broker, rank, &[]))
        .collect();
    let (sender, receiver) = reader(&broker).split();
    let tasks: Vec<Vec<u8>> = (0..3_000u64)
        .map(|id| task(id, if id % 10 == 9 { 64 << 10 } else { 64 }))
        .collect();
    let done = runtime().block_on(async {
        let receiver = receiver.into_async().unwrap();
        let mut expected = std::collections::HashMap::new();
        let mut next = 0;
        for worker in 1..=3u32 {
            sender.send(worker, &tasks[next]).unwrap();
            expected.insert(worker, (next as u64, fnv1a(&tasks[next])));
            next += 1;
        }
        let mut done = [0usize; 4];
        for _ in 0..tasks.len() {
            let (worker, answer) = receiver.recv_any().await.unwrap();
            let (id, hash) = expected
                .remove(&worker)
                .expect("an answer nobody asked for");
            assert_eq!(answer[..8], id.to_le_bytes());
            assert_eq!(answer[8..], hash.to_le_bytes(), "task {id}");
            done[worker as usize] += 1;
            if next < tasks.len() {
                sender.send(worker, &tasks[next]).unwrap();
                expected.insert(worker, (next as u64, fnv1a(&tasks[next])));
                next += 1;
            }
        }
        for worker in 1..=3 {
            sender.send(worker, &[]).unwrap();
        }
        done
    });
    assert_eq!(done.iter().sum::<usize>(), tasks.len());
    assert!(
        done[1..].iter().all(|&n| n > 0),
        "every worker got tasks: {done:?}"
    );
    for child in children {
        let (ok, _, stderr) = common::finish(child);
        assert!(ok, "{stderr}");
    }
}

#[test]
fn a_killed_worker_is_named_after_its_last_answers() {
    let broker = Broker::start("tokio-kill", 3);
    let mut steady = farm_worker(&broker, 1, &[]);
    let mut doomed = farm_worker_with(&broker, 2, &["--burst-then-hang", "5"], Stdio::piped());
    let (sender, receiver) = reader(&broker).split();
    sender.send(2, &task(0, 64)).unwrap();
    let said = common::read_line_within(doomed.take_stdout().unwrap(), common::CHILD_DEADLINE);
    assert_eq!(said.trim(), "burst sent");
    doomed.kill();
    let _ = doomed.wait_timeout(Duration::from_secs(10)).unwrap();
    let (answers, error) = runtime().block_on(async {
        let receiver = receiver.into_async().unwrap();
        let mut answers = Vec::new();
        loop {
            match receiver.recv_any().await {
                Ok((2, answer)) => {
                    answers.push(u64::from_le_bytes(answer[..8].try_into().unwrap()))
                }
                Ok((other, _)) => panic!("rank {other} was given no task"),
                Err(error) => break (answers, error),
            }
        }
    });
    assert!(matches!(error, Error::PeerLost { rank: 2, .. }), "{error}");
    assert_eq!(answers, (0..5).map(|k| u64::MAX - k).collect::<Vec<_>>());
    steady.kill();
    let _ = steady.wait_timeout(Duration::from_secs(10));
}

#[test]
fn a_deadline_names_the_peers_and_the_thread_runs_other_tasks_meanwhile() {
    let broker = Broker::start("tokio-deadline", 3);
    let children: Vec<_> = (1..=2)
        .map(|rank| farm_worker(&broker, rank, &[]))
        .collect();
    let (sender, receiver) = reader(&broker).split();
    let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let error = runtime().block_on(async {
        let receiver = receiver.into_async().unwrap();
        // Another task on the same (only) thread ticks every 10 ms while recv_any waits: a wait
        // that blocked the thread would leave it no turn until the deadline.
        let counter = ticks.clone();
        let ticker = tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(10));
            loop {
                interval.tick().await;
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let error = receiver
            .with_timeout(Duration::from_millis(300))
            .recv_any()
            .await
            .unwrap_err();
        ticker.abort();
        error
    });
    assert!(
        matches!(&error, Error::Timeout { op: "recv_any", waiting_for, timeout, .. }
            if waiting_for == &[1, 2] && *timeout == Duration::from_millis(300)),
        "{error}"
    );
    // About 30 ticks in 300 ms; a blocked thread gives 1 (the first tick is immediate).
    let ticks = ticks.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        ticks >= 5,
        "the other task ran {ticks} times during the wait"
    );
    for worker in 1..=2 {
        sender.send(worker, &[]).unwrap();
    }
    for child in children {
        let (ok, _, stderr) = common::finish(child);
        assert!(ok, "{stderr}");
    }
}

#[test]
fn into_async_outside_a_runtime_is_misuse() {
    let broker = Broker::start("tokio-misuse", 2);
    let child = farm_worker(&broker, 1, &[]);
    let (sender, receiver) = reader(&broker).split();
    let error = receiver.into_async().unwrap_err();
    assert!(
        matches!(&error, Error::Misuse(text) if text.contains("tokio runtime")),
        "{error}"
    );
    sender.send(1, &[]).unwrap();
    let (ok, _, stderr) = common::finish(child);
    assert!(ok, "{stderr}");
}
