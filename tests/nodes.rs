//! `shmbroker::nodes`: collectives over a network that spans nodes, between real processes.
//! Every rank is this test binary started again (`nodes_rank`); the nodes are named per rank,
//! as a launcher on several machines would. The network here is a [`Network`] over a session of
//! every rank (a stand-in for the program's MPI: C, C++ and Python run the same algorithms over
//! Open MPI in CI); each node's ranks get a session of their own on top.

use shmbroker::Collectives;
use shmbroker::nodes::{Network, Nodes, RAILS_MIN_BYTES};
use shmbroker::session::{Error, Group, Session};
use shmbroker::{DType, ReduceOp};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

mod common;

/// A communicator over a shared session: the world, or a group of it.
struct Comm {
    session: Rc<RefCell<Session>>,
    group: Option<Group>,
}

impl Comm {
    fn run<R>(
        &self,
        call: impl FnOnce(&mut shmbroker::session::GroupView<'_>) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut session = self.session.borrow_mut();
        let world;
        let group = match &self.group {
            Some(group) => group,
            None => {
                let ranks: Vec<u32> = (0..session.world_size()).collect();
                world = session.group(&ranks)?;
                &world
            }
        };
        call(&mut session.on(group))
    }
}

impl Network for Comm {
    fn rank(&self) -> u32 {
        match &self.group {
            Some(group) => group.rank(),
            None => self.session.borrow().rank(),
        }
    }
    fn size(&self) -> u32 {
        match &self.group {
            Some(group) => group.size(),
            None => self.session.borrow().world_size(),
        }
    }
    fn split(&mut self, color: Option<u32>) -> Result<Option<Self>, Error> {
        let mine = color.unwrap_or(u32::MAX).to_le_bytes();
        let mut colors = vec![0u8; 4 * self.size() as usize];
        self.all_gather(&mine, &mut colors)?;
        let Some(color) = color else { return Ok(None) };
        let members: Vec<u32> = colors
            .chunks(4)
            .enumerate()
            .filter(|(_, c)| u32::from_le_bytes((*c).try_into().unwrap()) == color)
            .map(|(r, _)| match &self.group {
                Some(group) => group.ranks()[r],
                None => r as u32,
            })
            .collect();
        let group = self.session.borrow_mut().group(&members)?;
        Ok(Some(Self {
            session: Rc::clone(&self.session),
            group: Some(group),
        }))
    }
    fn all_gather(&mut self, mine: &[u8], out: &mut [u8]) -> Result<(), Error> {
        self.run(|on| on.all_gather_into(mine, out))
    }
    fn all_reduce(&mut self, data: &mut [u8], dtype: DType, op: ReduceOp) -> Result<(), Error> {
        self.run(|on| on.all_reduce_bytes(data, dtype, op))
    }
    fn broadcast(&mut self, root: u32, data: &mut [u8]) -> Result<(), Error> {
        let mine = (self.rank() == root).then_some(&*data);
        let got = self.run(|on| on.broadcast(root, mine))?;
        data.copy_from_slice(&got);
        Ok(())
    }
    fn barrier(&mut self) -> Result<(), Error> {
        self.run(|on| on.barrier())
    }
}

/// Rank `rank`'s `count` whole numbers for call `salt`.
fn values(rank: u32, salt: u32, count: usize) -> Vec<i64> {
    (0..count)
        .map(|i| ((i as u64 * 7 + u64::from(rank) * 3 + u64::from(salt)) % 5 + 1) as i64)
        .collect()
}

fn reference(size: u32, salt: u32, count: usize, op: ReduceOp) -> Vec<i64> {
    let mut out = values(0, salt, count);
    for rank in 1..size {
        for (o, x) in out.iter_mut().zip(values(rank, salt, count)) {
            *o = match op {
                ReduceOp::Sum => *o + x,
                ReduceOp::Prod => o.wrapping_mul(x),
                ReduceOp::Min => (*o).min(x),
                ReduceOp::Max => (*o).max(x),
                ReduceOp::BitXor => *o ^ x,
                _ => unreachable!(),
            };
        }
    }
    out
}

#[test]
#[ignore = "a rank of the tests below; runs only when they start it"]
fn nodes_rank() {
    let Some((scenario, session)) = common::rank_session() else {
        return;
    };
    if let Some(layout) = scenario.strip_prefix("death:") {
        return death_rank(layout, session);
    }
    let rank = session.rank();
    let nodes_of: Vec<&str> = scenario.split(',').collect();
    let size = nodes_of.len() as u32;
    let network = Comm {
        session: Rc::new(RefCell::new(session)),
        group: None,
    };
    let mut nodes = Nodes::with_node(network, nodes_of[rank as usize], Duration::from_secs(60))
        .expect("Nodes::with_node");
    assert_eq!((nodes.rank(), nodes.size()), (rank, size));
    let distinct: std::collections::HashSet<_> = nodes_of.iter().collect();
    assert_eq!(nodes.nodes() as usize, distinct.len());

    // all_reduce: through the leader (small) and on the rails (large, odd: padded).
    let large = RAILS_MIN_BYTES / 8 + 3;
    for (salt, count) in [0usize, 1, 7, 70_001, large].into_iter().enumerate() {
        let salt = salt as u32;
        for op in [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::BitXor,
        ] {
            let mut data = values(rank, salt, count);
            nodes.all_reduce(&mut data, op).unwrap();
            assert_eq!(
                data,
                reference(size, salt, count, op),
                "all_reduce {op:?} x{count}"
            );
        }
        let mut mean: Vec<f64> = vec![f64::from(rank + 1); count];
        nodes.all_reduce(&mut mean, ReduceOp::Avg).unwrap();
        assert!(
            mean.iter().all(|&x| x == f64::from(size + 1) / 2.0),
            "avg x{count}"
        );
    }
    // Floats: the same bits on every rank, below and above the rails' threshold.
    for count in [1000, large] {
        let mut noisy: Vec<f64> = (0..count)
            .map(|i| ((i as f64 + 0.37) * f64::from(rank + 3)).sin() / 7.0)
            .collect();
        nodes.all_reduce(&mut noisy, ReduceOp::Sum).unwrap();
        let bytes: &[u8] = bytemuck::cast_slice(&noisy);
        let everyone = nodes.all_gather(bytes).unwrap();
        for theirs in everyone.chunks(bytes.len()) {
            assert_eq!(
                theirs, bytes,
                "all_reduce of floats gave other bits elsewhere"
            );
        }
    }
    nodes.barrier().unwrap();
    for root in 0..size {
        let want = format!("from rank {root:02}").into_bytes();
        let mut data = if rank == root {
            want.clone()
        } else {
            vec![0; want.len()]
        };
        nodes.broadcast(root, &mut data).unwrap();
        assert_eq!(data, want, "broadcast from {root}");
    }
    assert!(matches!(
        nodes.broadcast(size, &mut [0u8; 4]),
        Err(Error::RankOutOfRange { .. })
    ));
    let gathered = nodes.all_gather(&[rank as u8, 7, rank as u8 * 2]).unwrap();
    let want: Vec<u8> = (0..size as u8).flat_map(|r| [r, 7, r * 2]).collect();
    assert_eq!(gathered, want, "all_gather in rank order");
    nodes.barrier().unwrap();
}

/// The last rank dies once every `Nodes` is made. Its node peer's next call fails naming it by
/// its network rank, though its node's session numbers it otherwise; the other nodes' calls
/// fail as their network's engine says (here: when that peer leaves), and none hangs.
fn death_rank(layout: &str, session: Session) {
    let rank = session.rank();
    let nodes_of: Vec<&str> = layout.split(',').collect();
    let last = nodes_of.len() as u32 - 1;
    let network = Comm {
        session: Rc::new(RefCell::new(session)),
        group: None,
    };
    let mut nodes = Nodes::with_node(network, nodes_of[rank as usize], Duration::from_secs(60))
        .expect("Nodes::with_node");
    nodes.barrier().unwrap();
    if rank == last {
        std::process::exit(0); // without leaving: a death
    }
    let result = nodes.barrier();
    if nodes_of[rank as usize] == nodes_of[last as usize] {
        match result {
            Err(Error::PeerLost { rank: named, .. }) => assert_eq!(named, last, "the dead rank"),
            other => panic!("rank {rank}: a barrier after rank {last} died gave {other:?}"),
        }
    } else {
        assert!(
            result.is_err(),
            "rank {rank}: a barrier passed after rank {last} died"
        );
    }
}

fn run(name: &str, layout: &str) {
    let world = layout.trim_start_matches("death:").split(',').count() as u32;
    let results = common::run_ranks("nodes_rank", name, world, layout, &[]);
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter(|(_, (ok, _))| !ok)
        .map(|(rank, (_, stderr))| format!("rank {rank} of layout {layout}: {stderr}"))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn two_nodes_of_two_in_blocks() {
    run("nodes-blocks", "a,a,b,b");
}

#[test]
fn two_nodes_of_two_interleaved() {
    run("nodes-interleaved", "a,b,a,b");
}

#[test]
fn three_nodes_of_two() {
    run("nodes-three", "a,a,b,b,c,c");
}

#[test]
fn an_uneven_layout_of_one_and_two() {
    run("nodes-uneven", "a,b,b");
}

#[test]
fn a_death_inside_a_node_names_the_network_rank() {
    // Rank 3 is rank 1 of node b's session: its node peer must name it 3.
    run("nodes-death", "death:a,a,b,b");
}
