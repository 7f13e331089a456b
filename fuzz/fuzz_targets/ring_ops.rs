//! A random sequence of ring operations checked against a model queue, with a hostile peer that
//! may overwrite any bytes of the shared file between operations.
//!
//! Until the first overwrite, the ring must behave exactly like the model: FIFO, `Full` only at
//! capacity, `Empty` only when empty, `Disconnected` only after a close and a drain. After an
//! overwrite only memory safety is checked: every call must return, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker_queues::{Consumer, Producer, TryRecvError, TrySendError, create};
use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

const CAPACITY: usize = 4;

fuzz_target!(|data: &[u8]| {
    let fd = create::<u64>(CAPACITY).expect("create");
    let file = File::from(fd.try_clone().expect("dup"));
    let file_size = file.metadata().expect("fstat").len();
    let mut tx = Some(Producer::<u64>::join(fd.as_fd()).expect("join producer"));
    let mut rx = Some(Consumer::<u64>::join(fd.as_fd()).expect("join consumer"));
    let mut model = VecDeque::new();
    let mut next = 0u64;
    let mut corrupted = false;
    let mut bytes = data.iter().copied();

    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        match op % 7 {
            0 => {
                let Some(tx) = tx.as_mut() else { continue };
                let result = tx.try_send(next);
                if !corrupted {
                    match result {
                        Ok(()) => model.push_back(next),
                        Err(TrySendError::Full(v)) => {
                            assert_eq!(v, next);
                            assert_eq!(model.len(), CAPACITY, "Full below capacity");
                        }
                        Err(TrySendError::Disconnected(_)) => assert!(rx.is_none()),
                        Err(other) => panic!("uncorrupted ring reported {other:?}"),
                    }
                }
                next += 1;
            }
            1 => {
                let Some(rx) = rx.as_mut() else { continue };
                let result = rx.try_recv();
                if !corrupted {
                    match result {
                        Ok(value) => assert_eq!(Some(value), model.pop_front(), "not FIFO"),
                        Err(TryRecvError::Empty) => {
                            assert!(model.is_empty() && tx.is_some());
                        }
                        Err(TryRecvError::Disconnected) => {
                            assert!(model.is_empty() && tx.is_none());
                        }
                        Err(other) => panic!("uncorrupted ring reported {other:?}"),
                    }
                }
            }
            2 => {
                let Some(tx) = tx.as_mut() else { continue };
                let batch: Vec<u64> = (next..next + u64::from(arg % 8)).collect();
                next += batch.len() as u64;
                let result = tx.try_send_batch(&batch);
                if !corrupted {
                    let room = CAPACITY - model.len();
                    match result {
                        Ok(sent) => {
                            assert_eq!(sent, batch.len().min(room));
                            model.extend(&batch[..sent]);
                        }
                        Err(TrySendError::Full(())) => assert_eq!(room, 0),
                        Err(TrySendError::Disconnected(())) => assert!(rx.is_none()),
                        Err(other) => panic!("uncorrupted ring reported {other:?}"),
                    }
                }
            }
            3 => {
                let Some(rx) = rx.as_mut() else { continue };
                let mut buffer = vec![0u64; usize::from(arg % 8)];
                let result = rx.try_recv_batch(&mut buffer);
                if !corrupted {
                    match result {
                        Ok(count) => {
                            assert_eq!(count, buffer.len().min(model.len()));
                            for value in &buffer[..count] {
                                assert_eq!(Some(*value), model.pop_front(), "not FIFO");
                            }
                        }
                        Err(TryRecvError::Empty) => assert!(model.is_empty() && tx.is_some()),
                        Err(TryRecvError::Disconnected) => {
                            assert!(model.is_empty() && tx.is_none());
                        }
                        Err(other) => panic!("uncorrupted ring reported {other:?}"),
                    }
                }
            }
            4 => {
                // The hostile peer: 8 bytes anywhere in the file.
                let offset =
                    (u64::from(arg) * 8 + u64::from(bytes.next().unwrap_or(0))) % file_size;
                let garbage: Vec<u8> = bytes.by_ref().take(8).collect();
                let _ = file.write_all_at(&garbage, offset);
                corrupted |= !garbage.is_empty();
            }
            5 => drop(tx.take()),
            _ => drop(rx.take()),
        }
    }
});
