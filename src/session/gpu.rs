//! Sharing GPU memory handles: [`GpuHandle`] messages, with their fd when the kind has one.
//!
//! The handles travel as a `Pod` all-gather (eagerly, in ring slots: 112 bytes each); fds
//! travel through the fd exchange (`pidfd_getfd`, or the broker relay). The library never links
//! a GPU runtime: opening a handle is the caller's business, with whatever runtime exported it.

use super::state::Session;
use crate::error::Error;
use shmbroker_bindings::{GpuHandle, GpuHandleKind};
use std::os::fd::{BorrowedFd, OwnedFd};

/// Checks that `fd` is present exactly when `handle`'s kind carries one.
fn check_own(handle: &GpuHandle, fd: Option<BorrowedFd<'_>>) -> Result<GpuHandleKind, Error> {
    let kind = handle
        .handle_kind()
        .ok_or_else(|| Error::Misuse(format!("unknown GPU handle kind {}", handle.kind)))?;
    match (kind.carries_fd(), fd.is_some()) {
        (true, false) => Err(Error::Misuse(format!("a {kind:?} handle needs its fd"))),
        (false, true) => Err(Error::Misuse(format!("a {kind:?} handle carries no fd"))),
        _ => Ok(kind),
    }
}

/// The kind of a handle that came from `peer`.
fn kind_from(peer: u32, handle: &GpuHandle) -> Result<GpuHandleKind, Error> {
    handle.handle_kind().ok_or_else(|| Error::Protocol {
        peer,
        detail: format!("unknown GPU handle kind {}", handle.kind),
    })
}

impl Session {
    /// Every rank's GPU handle, with its fd for the kinds that carry one, indexed by rank.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for an unknown kind, or an fd given (or missing) against the kind;
    /// [`Error::Protocol`] when a peer's kind is unknown; otherwise as for
    /// [`Session::exchange_fds`].
    pub fn all_gather_gpu_handles(
        &mut self,
        handle: &GpuHandle,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Vec<(GpuHandle, Option<OwnedFd>)>, Error> {
        check_own(handle, fd)?;
        let handles = self.all_gather_pod(handle)?;
        let mut exporters = Vec::new();
        for (peer, handle) in (0u32..).zip(&handles) {
            if kind_from(peer, handle)?.carries_fd() {
                exporters.push(peer);
            }
        }
        let fds: Vec<Option<OwnedFd>> = if exporters.is_empty() {
            handles.iter().map(|_| None).collect()
        } else {
            let mine: Vec<BorrowedFd<'_>> = fd
                .filter(|_| exporters.contains(&self.rank()))
                .into_iter()
                .collect();
            let mut moved = self
                .collective("all_gather_gpu_handles", |session, team, deadline| {
                    session.move_fds(team, &exporters, &mine, 1, deadline)
                })?;
            (0..self.world_size())
                .map(|rank| moved.take_one(rank))
                .collect()
        };
        Ok(handles.into_iter().zip(fds).collect())
    }

    /// `root`'s GPU handle (with its fd for the kinds that carry one) on every rank: the root
    /// passes `Some`, the others `None`.
    ///
    /// # Errors
    ///
    /// As for [`Self::all_gather_gpu_handles`], and [`Error::Misuse`] when the root passes
    /// `None` or another rank `Some`.
    pub fn broadcast_gpu_handle(
        &mut self,
        root: u32,
        offered: Option<(&GpuHandle, Option<BorrowedFd<'_>>)>,
    ) -> Result<(GpuHandle, Option<OwnedFd>), Error> {
        if let Some((handle, fd)) = offered {
            check_own(handle, fd)?;
        }
        let bytes = crate::Collectives::broadcast(
            self,
            root,
            offered.map(|(handle, _)| bytemuck::bytes_of(handle)),
        )?;
        let handle: GpuHandle =
            bytemuck::try_pod_read_unaligned(&bytes).map_err(|_| Error::Protocol {
                peer: root,
                detail: format!("a GPU handle of {} bytes", bytes.len()),
            })?;
        if !kind_from(root, &handle)?.carries_fd() {
            return Ok((handle, None));
        }
        let fd = self.broadcast_fd(root, offered.and_then(|(_, fd)| fd))?;
        Ok((handle, Some(fd)))
    }
}
