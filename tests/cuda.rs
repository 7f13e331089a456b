//! Real GPU memory shared between two worker processes (`--features cuda`): rank 0 exports a
//! legacy CUDA IPC handle and a VMM POSIX-fd handle through shmbroker, rank 1 opens both and
//! checks every byte (`cuda-check`, a binary of this crate). The CUDA driver is loaded at run time; without
//! one, the test says so and passes without checking anything.

#![cfg(feature = "cuda")]

use shmbroker::handshake::{Config, Listener};
use shmbroker_test_support::process::spawn_with_fds;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn device_memory_is_shared_between_two_worker_processes() {
    let dir = std::env::temp_dir().join(format!("shmbroker-cuda-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("broker.sock");
    let config = Config {
        world_size: 2,
        ..Config::default()
    };
    let mut listener = Listener::bind(&socket, config).unwrap();
    let stop = listener.stop_handle();
    let broker = std::thread::spawn(move || listener.serve(|_| {}));

    let children: Vec<_> = (0..2)
        .map(|rank| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_cuda-check"));
            command
                .args(["--socket", socket.to_str().unwrap()])
                .args(["--rank", &rank.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            spawn_with_fds(&mut command, &[]).unwrap()
        })
        .collect();
    let mut results = Vec::new();
    for mut child in children {
        let status = child
            .wait_timeout(Duration::from_secs(120))
            .unwrap()
            .expect("cuda-check still running after 120 s");
        let (mut stdout, mut stderr) = (String::new(), String::new());
        if let Some(pipe) = child.stdout() {
            let _ = pipe.read_to_string(&mut stdout);
        }
        if let Some(mut pipe) = child.take_stderr() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        results.push((status.code(), stdout, stderr));
    }
    stop.stop();
    broker.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    if results.iter().all(|(code, _, _)| *code == Some(77)) {
        eprintln!("skipped: {}", results[0].2.trim());
        return;
    }
    for (rank, (code, stdout, stderr)) in results.iter().enumerate() {
        assert_eq!(*code, Some(0), "rank {rank}: {stdout}{stderr}");
    }
    assert!(results[1].1.contains("verified"), "{}", results[1].1);
    println!("{}{}", results[0].1, results[1].1);
}
