//! Sending and receiving bytes with file descriptors attached (`SCM_RIGHTS`), see unix(7).
//!
//! Both calls are non-blocking (`MSG_DONTWAIT`); callers poll with their own deadlines.
//!
//! Receiving parses the control buffer itself rather than through nix's iterator: when the kernel
//! truncates the control data (`MSG_CTRUNC`), the fds that did fit are already installed in this
//! process, and nix's iterator would refuse to name them, leaking them. Here every fd that arrived
//! is owned (and so closed on any error) before the truncation is reported.

use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, MsgFlags, recvmsg, sendmsg};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `size_of::<cmsghdr>()` on 64-bit Linux: `cmsg_len: usize`, `cmsg_level: i32`, `cmsg_type: i32`.
const CMSG_HEADER: usize = 16;

/// The most fds one message can carry: the kernel's `SCM_MAX_FD`.
pub const MAX_FDS: usize = 253;

/// Room for [`MAX_FDS`], with headers for a few control messages.
const CONTROL_BUFFER: usize = CMSG_HEADER * 4 + MAX_FDS * size_of::<RawFd>();

const _: () = assert!(size_of::<nix::libc::cmsghdr>() == CMSG_HEADER);

/// Sends `parts` as one message with `fds` attached, without blocking and without SIGPIPE.
/// Returns the number of bytes sent.
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    parts: &[&[u8]],
    fds: &[BorrowedFd<'_>],
) -> Result<usize, Errno> {
    let iov: Vec<IoSlice<'_>> = parts.iter().map(|part| IoSlice::new(part)).collect();
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let control: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
    sendmsg::<()>(
        socket.as_raw_fd(),
        &iov,
        control,
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        None,
    )
}

/// What one [`recv_with_fds`] call got.
#[derive(Debug)]
pub struct Received {
    /// Bytes read into the buffer (0: the peer closed).
    pub bytes: usize,
    /// Whether the kernel cut the control data; any fds that fit were still pushed.
    pub control_truncated: bool,
}

/// Receives once without blocking, with `MSG_CMSG_CLOEXEC`, appending every fd that arrived to
/// `fds` (owned from then on).
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> Result<Received, Errno> {
    let mut control = vec![0u8; CONTROL_BUFFER];
    let mut iov = [IoSliceMut::new(buffer)];
    let message = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )?;
    let received = Received {
        bytes: message.bytes,
        control_truncated: message.flags.contains(MsgFlags::MSG_CTRUNC),
    };
    for fd in scm_rights(&control) {
        // SAFETY: the kernel installed this fd in our table for this message just now; no other
        // owner exists, and each appears once in the control data.
        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    Ok(received)
}

/// The fds in every `SCM_RIGHTS` control message in a zero-initialised, kernel-filled buffer.
fn scm_rights(control: &[u8]) -> Vec<RawFd> {
    let mut fds = Vec::new();
    let mut at = 0;
    while at + CMSG_HEADER <= control.len() {
        let word = |offset: usize, len: usize| &control[at + offset..at + offset + len];
        let len = usize::from_ne_bytes(word(0, 8).try_into().unwrap_or_default());
        let level = i32::from_ne_bytes(word(8, 4).try_into().unwrap_or_default());
        let kind = i32::from_ne_bytes(word(12, 4).try_into().unwrap_or_default());
        if len < CMSG_HEADER {
            break; // zero: the end of what the kernel wrote
        }
        let end = (at + len).min(control.len());
        if level == nix::libc::SOL_SOCKET && kind == nix::libc::SCM_RIGHTS {
            fds.extend(
                control[at + CMSG_HEADER..end]
                    .chunks_exact(size_of::<RawFd>())
                    .map(|fd| RawFd::from_ne_bytes(fd.try_into().unwrap_or_default())),
            );
        }
        at += len.next_multiple_of(8);
    }
    fds
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn memfd() -> OwnedFd {
        nix::sys::memfd::memfd_create(c"fdpass-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .unwrap()
    }

    #[test]
    fn fds_arrive_as_new_close_on_exec_descriptors_of_the_same_files() {
        let (a, b) = UnixStream::pair().unwrap();
        let files = [memfd(), memfd(), memfd()];
        let borrowed: Vec<_> = files.iter().map(AsFd::as_fd).collect();
        assert_eq!(send_with_fds(a.as_fd(), &[b"abc", b"de"], &borrowed), Ok(5));
        let mut buffer = [0u8; 16];
        let mut fds = Vec::new();
        let received = recv_with_fds(b.as_fd(), &mut buffer, &mut fds).unwrap();
        assert_eq!((received.bytes, received.control_truncated), (5, false));
        assert_eq!(&buffer[..5], b"abcde");
        assert_eq!(fds.len(), 3);
        for (sent, got) in files.iter().zip(&fds) {
            let (s, g) = (
                nix::sys::stat::fstat(sent).unwrap(),
                nix::sys::stat::fstat(got).unwrap(),
            );
            assert_eq!((s.st_dev, s.st_ino), (g.st_dev, g.st_ino));
            assert_ne!(sent.as_raw_fd(), got.as_raw_fd());
            let flags = nix::fcntl::fcntl(got, nix::fcntl::FcntlArg::F_GETFD).unwrap();
            assert_ne!(
                flags & nix::libc::FD_CLOEXEC,
                0,
                "received fd must be close-on-exec"
            );
        }
    }

    #[test]
    fn the_parser_stops_at_the_end_of_what_the_kernel_wrote() {
        assert!(scm_rights(&[0u8; CONTROL_BUFFER]).is_empty());
        // One SCM_RIGHTS header claiming more than the buffer holds: only whole fds are taken.
        let mut control = vec![0u8; 24];
        control[..8].copy_from_slice(&1000usize.to_ne_bytes());
        control[8..12].copy_from_slice(&nix::libc::SOL_SOCKET.to_ne_bytes());
        control[12..16].copy_from_slice(&nix::libc::SCM_RIGHTS.to_ne_bytes());
        control[16..20].copy_from_slice(&7i32.to_ne_bytes());
        control[20..24].copy_from_slice(&9i32.to_ne_bytes());
        assert_eq!(scm_rights(&control), [7, 9]);
    }
}
