//! `shmbroker.Group`: the ranks a collective runs among.

use crate::errors;
use pyo3::prelude::*;
use shmbroker::session::Group;

/// A group of ranks, made by :meth:`Session.group` or :meth:`Session.shrink`. Pass it as
/// ``group=`` to any collective (as with ``torch.distributed``) to run it among the members
/// only: ranks, roots, blocks and counts are then group ranks.
#[pyclass(module = "shmbroker", name = "Group", frozen)]
#[derive(Debug)]
pub(crate) struct PyGroup {
    pub(crate) group: Group,
}

#[pymethods]
impl PyGroup {
    /// This rank's rank in the group.
    #[getter]
    fn rank(&self) -> u32 {
        self.group.rank()
    }

    /// The number of ranks in the group.
    #[getter]
    fn size(&self) -> u32 {
        self.group.size()
    }

    /// The members' world ranks, by group rank.
    #[getter]
    fn ranks(&self) -> Vec<u32> {
        self.group.ranks().to_vec()
    }

    /// The world rank of group rank ``rank``; raises :class:`MisuseError` when there is none.
    fn world_rank(&self, rank: i64) -> PyResult<u32> {
        u32::try_from(rank)
            .ok()
            .and_then(|rank| self.group.world_rank(rank))
            .ok_or_else(|| {
                errors::misuse(format!(
                    "rank {rank} is not in a group of {}",
                    self.group.size()
                ))
            })
    }

    fn __repr__(&self) -> String {
        format!(
            "<shmbroker.Group rank {} of ranks {:?}>",
            self.group.rank(),
            self.group.ranks()
        )
    }
}
