//! Who a worker trusts: the broker it logs on to, and the directory its socket lies in.
//!
//! A socket path in a shared directory such as `/tmp` can be taken by any user first. Two
//! checks close that door:
//!
//! * [`private_dir`] makes (or finds) a directory only this user can enter, and refuses one
//!   that another user owns or others may write. A launcher's socket lies there.
//! * Every client checks the credentials of the broker it reached (`SO_PEERCRED`, taken by the
//!   kernel when the broker called `listen`) before it sends a byte ([`check_broker`]). The
//!   broker must run as this process's effective uid or as root (root can read any process's
//!   memory anyway). [`BROKER_UID_VAR`] trusts one more uid, for a `serve` run by a service user.

use crate::error::Error;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The variable that names one more uid a worker trusts to run its broker (a `shmbroker serve`
/// run by a service account, say).
pub const BROKER_UID_VAR: &str = "SHMBROKER_BROKER_UID";

/// This process's effective uid.
fn my_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The uid [`BROKER_UID_VAR`] names, if set.
///
/// # Errors
///
/// [`Error::InvalidConfig`] when the value is not a uid.
fn extra_trusted_uid() -> Result<Option<u32>, Error> {
    match std::env::var(BROKER_UID_VAR) {
        Err(_) => Ok(None),
        Ok(value) => value
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::InvalidConfig {
                field: BROKER_UID_VAR,
                reason: format!("{value:?} is not a uid"),
            }),
    }
}

/// Whether a broker running as `uid` may be trusted by a client running as `mine`, with
/// `extra` the uid [`BROKER_UID_VAR`] names.
fn trusts(uid: u32, mine: u32, extra: Option<u32>) -> bool {
    uid == mine || uid == 0 || extra == Some(uid)
}

/// Checks who listens at the other end of `stream` (connected to `path`) before anything is
/// sent: the broker must run as this user, as root, or as the uid [`BROKER_UID_VAR`] names.
///
/// # Errors
///
/// [`Error::UntrustedBroker`] naming the broker's uid and pid; [`Error::Sys`] when the kernel
/// does not say; [`Error::InvalidConfig`] for a bad [`BROKER_UID_VAR`].
pub(crate) fn check_broker(stream: &UnixStream, path: &Path) -> Result<(), Error> {
    let credentials =
        nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
            .map_err(Error::sys("getsockopt(SO_PEERCRED) of the broker"))?;
    let (uid, mine) = (credentials.uid(), my_uid());
    // The variable is read only for a broker of another user: a bad value never stands between
    // a worker and its own broker.
    if trusts(uid, mine, None) || trusts(uid, mine, extra_trusted_uid()?) {
        return Ok(());
    }
    Err(Error::UntrustedBroker {
        path: path.to_path_buf(),
        uid,
        pid: credentials.pid(),
        mine,
    })
}

/// Makes `dir` (mode 0700) if it is missing, and checks that it is private to this user: a
/// real directory (not a link), owned by this effective uid, that no group or other may enter,
/// in a parent that no other user can rename it in (owned by this user or root, and sticky if
/// others may write it, as `/tmp` is). Several processes may call it at once.
///
/// # Errors
///
/// [`Error::NotPrivate`] naming the owner or mode found; [`Error::Path`] when it cannot be
/// made or examined.
pub fn private_dir(dir: &Path) -> Result<(), Error> {
    let path_error = |op| {
        move |e: std::io::Error| Error::Path {
            op,
            path: dir.to_path_buf(),
            source: crate::error::io_errno(&e),
        }
    };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(path_error("creating the private directory")(e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(path_error("examining"))?;
    let mine = my_uid();
    let parent = dir
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .map(std::fs::metadata)
        .transpose()
        .map_err(path_error("examining the parent of"))?;
    let open_parent = parent.filter(|parent| {
        let shared = parent.mode() & 0o022 != 0 && parent.mode() & 0o1000 == 0;
        (parent.uid() != mine && parent.uid() != 0) || shared
    });
    let why = if let Some(parent) = open_parent {
        Some(format!(
            "its parent (owned by uid {}, mode {:04o}) lets other users rename it",
            parent.uid(),
            parent.mode() & 0o7777
        ))
    } else if meta.file_type().is_symlink() {
        Some("it is a symbolic link".to_string())
    } else if !meta.is_dir() {
        Some("it is not a directory".to_string())
    } else if meta.uid() != mine {
        Some(format!("it is owned by uid {}", meta.uid()))
    } else if meta.mode() & 0o077 != 0 {
        Some(format!(
            "its mode is {:04o}, open to others (0700 expected)",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(Error::NotPrivate {
            path: dir.to_path_buf(),
            why,
            mine,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn root_this_user_and_the_named_uid_are_trusted_and_no_one_else() {
        assert!(trusts(1000, 1000, None));
        assert!(trusts(0, 1000, None));
        assert!(trusts(77, 1000, Some(77)));
        assert!(!trusts(65534, 1000, None));
        assert!(!trusts(65534, 0, Some(77)));
    }

    #[test]
    fn a_private_dir_is_made_0700_and_an_open_one_is_refused() {
        let base = shmbroker_sys::TempDir::new("trust").unwrap();
        let dir = base.join("mine");
        private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // Again, as every local rank does.
        private_dir(&dir).unwrap();

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = private_dir(&dir).unwrap_err().to_string();
        assert!(error.contains("mode is 0777"), "{error}");

        let file = base.join("file");
        std::fs::write(&file, b"").unwrap();
        let error = private_dir(&file).unwrap_err().to_string();
        assert!(error.contains("not a directory"), "{error}");

        let link = base.join("link");
        std::os::unix::fs::symlink(base.path(), &link).unwrap();
        let error = private_dir(&link).unwrap_err().to_string();
        assert!(error.contains("symbolic link"), "{error}");

        // In a parent others may write and that is not sticky, it could be renamed away.
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = private_dir(&open.join("mine")).unwrap_err().to_string();
        assert!(error.contains("lets other users rename it"), "{error}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        private_dir(&open.join("mine")).unwrap();
    }
}
