//! Collectives of a job that spans nodes: shared memory inside each node, the program's own
//! network engine between nodes.
//!
//! shmbroker never carries bytes between machines. A program under a multi-node launcher
//! implements [`Network`] for the engine it already uses (its MPI binding, say), and
//! [`Nodes::new`] composes it with a [`Session`] of each node's ranks, as Open MPI's `coll/han`
//! and UCC's `cl/hier` compose their shared-memory and network components.
//!
//! **Where each rank stands.** Its node is `SHMBROKER_NODE` when set (so that tests on one
//! machine can form several nodes), otherwise the host's name and boot id, exchanged with
//! [`Network::all_gather`]. The ranks of one node, in the network's rank order, share one session
//! on a broker the node's first rank hosts in a fresh private directory; its path goes to the
//! others with [`Network::broadcast`].
//!
//! **Algorithms.** `leaders` is the first rank of every node; when every node has the same
//! number `L > 1` of ranks, rail `j` is the `j`-th rank of every node.
//!
//! | Call | Inside each node | Between nodes |
//! |---|---|---|
//! | all-reduce up to [`RAILS_MIN_BYTES`], or on an uneven layout | reduce to the first rank, then broadcast | all-reduce among leaders |
//! | all-reduce above it | reduce-scatter, then all-gather | all-reduce of each slice on its rail |
//! | barrier | barrier, twice | barrier among leaders |
//! | broadcast | in the root's node, then in the others | broadcast among leaders |
//! | all-gather | all-gather, then broadcast | all-gather of node blocks among leaders |
//!
//! Floats combine in the node in rank order, then between nodes in the engine's order: every
//! rank gets the same bits for a fixed layout and engine. [`ReduceOp::Avg`] is a sum divided by
//! the size (floats only).
//!
//! **Errors** from inside a node name the network's ranks (their diagnosis sentences keep the
//! node's numbers). [`Nodes::new`] agrees over the whole network: every rank gets its `Nodes`,
//! or every rank an error. A later failure inside a node returns on that node's ranks only,
//! while the other nodes wait in the network's engine (an MPI has no deadline): end the job on
//! any error, as MPI programs do.

use crate::Collectives;
use crate::handshake::LeftAfter;
use crate::reduce::{DType, Element, ReduceOp};
use crate::session::{Error, Session};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::PathBuf;
use std::time::Duration;

/// All-reduces of more bytes than this, on a layout with the same number of ranks on every
/// node, run on every rail at once (multi-leader); smaller ones through the node's first rank.
pub const RAILS_MIN_BYTES: usize = 256 * 1024;

/// The variable that names this process's node (any text), in place of the host's identity.
pub const NODE_VAR: &str = "SHMBROKER_NODE";

/// The longest node name exchanged, in bytes (longer ones are cut).
const NAME_MAX: usize = 256;

/// What [`Nodes`] needs of the program's network engine: the calls of an MPI communicator, on
/// bytes. Implement it for the engine's communicator (an `mpi` crate `SimpleCommunicator`, say);
/// every call is collective over the communicator's ranks, made in the same order on each.
pub trait Network: Sized {
    /// This rank's rank in the communicator.
    fn rank(&self) -> u32;
    /// The number of ranks of the communicator.
    fn size(&self) -> u32;
    /// The communicator of the ranks that pass the same `color`, ordered by their rank here
    /// (`MPI_Comm_split`); `None` for a rank that passes `None` (`MPI_UNDEFINED`).
    ///
    /// # Errors
    ///
    /// The engine's failure, as an [`Error`] (say, [`Error::Io`] or [`Error::Misuse`]).
    fn split(&mut self, color: Option<u32>) -> Result<Option<Self>, Error>;
    /// Every rank's `mine` (the same length on every rank) into `out`, in rank order.
    ///
    /// # Errors
    ///
    /// The engine's failure.
    fn all_gather(&mut self, mine: &[u8], out: &mut [u8]) -> Result<(), Error>;
    /// Combines every rank's `data` (elements of `dtype`) with `op`, into every rank's, in
    /// place. `op` is never [`ReduceOp::Avg`].
    ///
    /// # Errors
    ///
    /// The engine's failure; [`Error::Misuse`] for a type or operation it lacks.
    fn all_reduce(&mut self, data: &mut [u8], dtype: DType, op: ReduceOp) -> Result<(), Error>;
    /// Rank `root`'s `data` into every rank's (the same length on every rank).
    ///
    /// # Errors
    ///
    /// The engine's failure.
    fn broadcast(&mut self, root: u32, data: &mut [u8]) -> Result<(), Error>;
    /// Returns once every rank has called it.
    ///
    /// # Errors
    ///
    /// The engine's failure.
    fn barrier(&mut self) -> Result<(), Error>;
}

/// This process's node: [`NODE_VAR`], or the host's name and boot id.
#[must_use]
pub fn node_name() -> String {
    if let Some(named) = std::env::var_os(NODE_VAR).filter(|v| !v.is_empty()) {
        return named.to_string_lossy().into_owned();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}/{}", host.trim(), boot.trim())
}

/// Shmbroker's collectives over the ranks of a [`Network`] that may span nodes (see the module
/// docs).
#[derive(Debug)]
pub struct Nodes<N: Network> {
    rank: u32,
    size: u32,
    /// Per network rank: its node (numbered by first rank) and its index in that node.
    node_of: Vec<u32>,
    local_of: Vec<u32>,
    /// How many ranks the node with the most has.
    widest: u32,
    nodes: u32,
    local_rank: u32,
    local_size: u32,
    /// The session of this node's ranks; `None` for a node of one.
    session: Option<Session>,
    /// This node's network ranks, by session rank.
    node_ranks: Vec<u32>,
    leaders: Option<N>,
    rail: Option<N>,
    /// The directory of the node's broker socket, on the node's first rank.
    dir: Option<PathBuf>,
}

impl<N: Network> Nodes<N> {
    /// Makes the layout, the node's session (within `timeout`, also every later call's deadline
    /// inside a node) and the leaders' and rails' communicators, collectively: every rank of
    /// `network` calls it.
    ///
    /// # Errors
    ///
    /// The network's failures; [`Error::Io`] when the node's first rank cannot make the
    /// socket's directory; the session's logon errors.
    pub fn new(network: N, timeout: Duration) -> Result<Self, Error> {
        Self::with_node(network, &node_name(), timeout)
    }

    /// [`Self::new`] with this rank's node named by the caller (what its launcher says, say)
    /// instead of [`node_name`]. Ranks that pass the same name are on one node.
    ///
    /// # Errors
    ///
    /// As [`Self::new`].
    pub fn with_node(mut network: N, name: &str, timeout: Duration) -> Result<Self, Error> {
        let (rank, size) = (network.rank(), network.size());
        let mut mine = [0u8; NAME_MAX];
        let len = name.len().min(NAME_MAX);
        mine[..len].copy_from_slice(&name.as_bytes()[..len]);
        let mut names = vec![0u8; NAME_MAX * size as usize];
        network.all_gather(&mine, &mut names)?;
        let mut firsts: Vec<&[u8]> = Vec::new();
        let mut counts: Vec<u32> = Vec::new();
        let (mut node_of, mut local_of) = (Vec::new(), Vec::new());
        for name in names.chunks(NAME_MAX) {
            let node = firsts
                .iter()
                .position(|first| *first == name)
                .unwrap_or_else(|| {
                    firsts.push(name);
                    counts.push(0);
                    firsts.len() - 1
                });
            node_of.push(node as u32);
            local_of.push(counts[node]);
            counts[node] += 1;
        }
        let node = node_of[rank as usize];
        let local_rank = local_of[rank as usize];
        let local_size = counts[node as usize];
        let balanced = counts.iter().all(|&c| c == local_size) && local_size > 1;
        let node_ranks = (0..size).filter(|&r| node_of[r as usize] == node).collect();
        let mut node_net = network.split(Some(node))?.ok_or_else(|| {
            Error::Misuse("the network left this rank out of its own node's split".into())
        })?;
        let leaders = network.split((local_rank == 0).then_some(0))?;
        let rail = if balanced {
            network.split(Some(local_rank))?
        } else {
            None
        };
        let mut nodes = Self {
            rank,
            size,
            widest: counts.iter().copied().max().unwrap_or(1),
            nodes: counts.len() as u32,
            node_of,
            local_of,
            local_rank,
            local_size,
            session: None,
            node_ranks,
            leaders,
            rail,
            dir: None,
        };
        let joined = if local_size > 1 {
            nodes.join(&mut node_net, local_rank, timeout)
        } else {
            Ok(())
        };
        // Every rank learns whether every node's session is there: none goes on alone.
        let mut failed = [u8::from(joined.is_err())];
        network.all_reduce(&mut failed, DType::U8, ReduceOp::Max)?;
        joined?;
        if failed[0] != 0 {
            return Err(Error::Launch(
                "another node's ranks could not make their session".into(),
            ));
        }
        Ok(nodes)
    }

    /// Joins this node's session: its first rank hosts the broker in a fresh directory and
    /// tells the others the socket's path.
    fn join(&mut self, node: &mut N, local_rank: u32, timeout: Duration) -> Result<(), Error> {
        // The socket's path, or why the first rank could not make its directory, after a byte
        // saying which (1: a path, 2: a reason).
        let mut word = [0u8; 4096];
        if local_rank == 0 {
            let (kind, text) = match self.make_dir() {
                Ok(socket) => (1, socket.into_os_string().into_encoded_bytes()),
                Err(error) => (2, error.to_string().into_bytes()),
            };
            let len = text.len().min(word.len() - 2);
            word[0] = kind;
            word[1..=len].copy_from_slice(&text[..len]);
        }
        node.broadcast(0, &mut word)?;
        let end = word[1..]
            .iter()
            .position(|&b| b == 0)
            .map_or(word.len(), |at| at + 1);
        let text = String::from_utf8_lossy(&word[1..end]).into_owned();
        if word[0] != 1 {
            return Err(Error::Launch(format!(
                "the node's first rank could not host its broker: {text}"
            )));
        }
        let launch = crate::launch::Launch {
            rank: local_rank,
            world_size: self.local_size,
            socket: PathBuf::from(text),
            source: "shmbroker::nodes::Nodes::new".into(),
            external_broker: false,
            private_dir: None,
        };
        self.session = Some(Session::from_launch(&launch, timeout)?);
        Ok(())
    }

    /// Makes the node's broker directory (private to this user), kept for the drop; returns
    /// the socket's path in it.
    fn make_dir(&mut self) -> Result<PathBuf, Error> {
        let dir = std::env::temp_dir().join(format!(
            "shmbroker-nodes-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| Error::Io {
                what: "making the node's broker directory",
                source,
            })?;
        let socket = dir.join("broker.sock");
        self.dir = Some(dir);
        if socket.as_os_str().len() >= 4000 {
            return Err(Error::Misuse(format!("socket path {socket:?} is too long")));
        }
        Ok(socket)
    }

    /// This rank's rank in the network.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    #[must_use]
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The number of nodes the ranks are on.
    #[must_use]
    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// `error` from the node's session, naming the network's ranks (its diagnosis sentences
    /// keep the node's numbers).
    fn job_error(&self, mut error: Error) -> Error {
        let to = |local: &mut u32| {
            if let Some(&rank) = self.node_ranks.get(*local as usize) {
                *local = rank;
            }
        };
        match &mut error {
            Error::PeerLeft { rank, after, .. } => {
                to(rank);
                if let Some(LeftAfter::Died(other) | LeftAfter::TimedOut(other)) = after {
                    to(other);
                }
            }
            Error::PeerGaveUp { rank, named, .. } => {
                to(rank);
                named.iter_mut().for_each(to);
            }
            Error::PeerNeverJoined { rank, after, .. } => {
                to(rank);
                to(after);
            }
            Error::PeerLost { rank, .. } | Error::PeerRejoined { rank, .. } => to(rank),
            Error::Timeout {
                waiting_for,
                stopped,
                ..
            } => {
                waiting_for.iter_mut().for_each(to);
                stopped.iter_mut().for_each(to);
            }
            Error::Protocol { peer, .. }
            | Error::CollectiveMismatch { peer, .. }
            | Error::Corrupted { peer, .. }
            | Error::Outbox { peer, .. }
            | Error::BufferTooSmall { peer, .. } => to(peer),
            _ => {}
        }
        error
    }

    /// Runs `call` on the node's session, if this node has more than this rank.
    fn local<R>(
        &mut self,
        call: impl FnOnce(&mut Session) -> Result<R, Error>,
    ) -> Result<Option<R>, Error> {
        match self.session.as_mut() {
            None => Ok(None),
            Some(session) => call(session).map(Some).map_err(|e| self.job_error(e)),
        }
    }

    /// Broadcasts `data` from the node's rank `root` (a local index) to the node.
    fn local_broadcast(&mut self, root: u32, data: &mut [u8]) -> Result<(), Error> {
        let mine = (self.local_rank == root).then_some(&*data);
        if let Some(got) = self.local(|s| s.broadcast(root, mine))? {
            if got.len() != data.len() {
                return Err(Error::Protocol {
                    peer: self.node_ranks[root as usize],
                    detail: format!(
                        "broadcast {} bytes for a buffer of {}",
                        got.len(),
                        data.len()
                    ),
                });
            }
            data.copy_from_slice(&got);
        }
        Ok(())
    }

    /// A barrier over every rank.
    ///
    /// # Errors
    ///
    /// As [`Collectives::barrier`] inside the node, naming the
    /// network's ranks; the network's.
    pub fn barrier(&mut self) -> Result<(), Error> {
        self.local(Session::barrier)?;
        if let Some(leaders) = self.leaders.as_mut() {
            leaders.barrier()?;
        }
        self.local(Session::barrier)?;
        Ok(())
    }

    /// Combines every rank's `data` with `op`, into every rank's, in place.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for [`ReduceOp::Avg`] of integers or an operation the type lacks; as
    /// [`Collectives::all_reduce`] inside the node, naming the
    /// network's ranks; the network's.
    pub fn all_reduce<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<(), Error> {
        crate::reduce::check_op::<T>(op)?;
        if op == ReduceOp::Avg && !matches!(T::DTYPE, DType::F32 | DType::F64) {
            return Err(Error::Misuse(format!(
                "avg across nodes is of f32 and f64, not {}",
                T::DTYPE.name()
            )));
        }
        let local_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        if self.rail.is_some() && std::mem::size_of_val(data) > RAILS_MIN_BYTES {
            self.all_reduce_rails(data, local_op)?;
        } else {
            self.local(|s| s.reduce(0, data, local_op))?;
            if let Some(leaders) = self.leaders.as_mut() {
                leaders.all_reduce(bytemuck::cast_slice_mut(data), T::DTYPE, local_op)?;
            }
            self.local_broadcast(0, bytemuck::cast_slice_mut(data))?;
        }
        if op == ReduceOp::Avg {
            let size = self.size;
            match T::DTYPE {
                DType::F32 => {
                    for x in bytemuck::cast_slice_mut::<T, f32>(data) {
                        *x /= size as f32;
                    }
                }
                DType::F64 => {
                    for x in bytemuck::cast_slice_mut::<T, f64>(data) {
                        *x /= f64::from(size);
                    }
                }
                _ => unreachable!("checked above"),
            }
        }
        Ok(())
    }

    /// Multi-leader: a reduce-scatter in the node, each slice on its rail, an all-gather in the
    /// node. `data` is padded to a whole number of slices.
    fn all_reduce_rails<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<(), Error> {
        let parts = self.local_size as usize;
        let slice = data.len().div_ceil(parts);
        let mut padded = vec![T::zeroed(); slice * parts];
        padded[..data.len()].copy_from_slice(data);
        let mut mine = vec![T::zeroed(); slice];
        self.local(|s| s.reduce_scatter(&padded, &mut mine, op))?;
        if let Some(rail) = self.rail.as_mut() {
            rail.all_reduce(bytemuck::cast_slice_mut(&mut mine), T::DTYPE, op)?;
        }
        self.local(|s| {
            s.all_gather_into(
                bytemuck::cast_slice(&mine),
                bytemuck::cast_slice_mut(&mut padded),
            )
        })?;
        data.copy_from_slice(&padded[..data.len()]);
        Ok(())
    }

    /// Rank `root`'s `data` into every rank's (the same length on every rank).
    ///
    /// # Errors
    ///
    /// [`Error::RankOutOfRange`] for a root past the last rank; as
    /// [`Collectives::broadcast`] inside the node, naming the
    /// network's ranks; the network's.
    pub fn broadcast(&mut self, root: u32, data: &mut [u8]) -> Result<(), Error> {
        if root >= self.size {
            return Err(Error::RankOutOfRange {
                rank: root,
                world_size: self.size,
            });
        }
        let root_node = self.node_of[root as usize];
        let here = self.node_of[self.rank as usize] == root_node;
        if here {
            self.local_broadcast(self.local_of[root as usize], data)?;
        }
        if let Some(leaders) = self.leaders.as_mut() {
            leaders.broadcast(root_node, data)?;
        }
        if !here {
            self.local_broadcast(0, data)?;
        }
        Ok(())
    }

    /// Every rank's `data` (the same length on every rank), in rank order.
    ///
    /// # Errors
    ///
    /// As [`Collectives::all_gather_into`] inside the node,
    /// naming the network's ranks; the network's.
    pub fn all_gather(&mut self, data: &[u8]) -> Result<Vec<u8>, Error> {
        let len = data.len();
        let block = self.widest as usize * len;
        let mut mine = vec![0u8; block];
        let local = self.local_size as usize * len;
        if self
            .local(|s| s.all_gather_into(data, &mut mine[..local]))?
            .is_none()
        {
            mine[..len].copy_from_slice(data);
        }
        let mut everything = vec![0u8; self.nodes as usize * block];
        if let Some(leaders) = self.leaders.as_mut() {
            leaders.all_gather(&mine, &mut everything)?;
        }
        self.local_broadcast(0, &mut everything)?;
        let mut out = Vec::with_capacity(self.size as usize * len);
        for r in 0..self.size as usize {
            let at = self.node_of[r] as usize * block + self.local_of[r] as usize * len;
            out.extend_from_slice(&everything[at..at + len]);
        }
        Ok(out)
    }
}

impl<N: Network> Drop for Nodes<N> {
    fn drop(&mut self) {
        drop(self.session.take());
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
