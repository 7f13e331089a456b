//! The Python API's arguments: deadlines, ranks, fds, GPU handles, reductions and element
//! types, each checked with an error that says what was expected.

use crate::buffer::Bytes;
use crate::errors;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use shmbroker::{DType, ReduceOp};
use std::os::fd::{BorrowedFd, RawFd};
use std::time::Duration;

/// A call's ``timeout=``: left out (the session's deadline), or what the caller gave (``None``
/// or a number of seconds, see [`deadline_arg`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum CallTimeout {
    Session,
    Given(Option<f64>),
}

impl<'a, 'py> FromPyObject<'a, 'py> for CallTimeout {
    type Error = PyErr;

    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_none() {
            return Ok(Self::Given(None));
        }
        let secs: f64 = obj.extract().map_err(|_| {
            errors::misuse(format!(
                "timeout {obj:?}: a number of seconds above 0, or None for no deadline"
            ))
        })?;
        Ok(Self::Given(Some(secs)))
    }
}

/// A deadline a caller gave: `None` (or infinity) for none at all (deaths and departures still
/// end a wait), otherwise a number of seconds above 0.
pub(crate) fn deadline_arg(secs: Option<f64>) -> PyResult<Duration> {
    match secs {
        None => Ok(Duration::MAX),
        Some(secs) if secs == f64::INFINITY => Ok(Duration::MAX),
        Some(secs) => seconds(secs),
    }
}

/// A deadline of `secs` seconds: finite and above 0.
pub(crate) fn seconds(secs: f64) -> PyResult<Duration> {
    // NaN is not above 0 either.
    if secs.is_nan() || secs <= 0.0 {
        return Err(errors::misuse(format!(
            "timeout {secs}: a deadline is a number of seconds above 0 (None: no deadline)"
        )));
    }
    Duration::try_from_secs_f64(secs)
        .map_err(|_| errors::misuse(format!("timeout {secs} is not a number of seconds")))
}

/// A rank argument: 0 or more (whether it is in the world is the library's to say).
pub(crate) fn rank_arg(rank: i64) -> PyResult<u32> {
    u32::try_from(rank).map_err(|_| {
        errors::misuse(format!(
            "rank {rank}: a rank is a number from 0 to the world size - 1"
        ))
    })
}

/// The fd `fd` stands for (an int, or an object with `fileno()`), once `fcntl` says it is open.
pub(crate) fn fd_arg(fd: &Bound<'_, PyAny>) -> PyResult<RawFd> {
    let number: RawFd = match fd.extract() {
        Ok(number) => number,
        Err(_) if fd.hasattr("fileno")? => fd.call_method0("fileno")?.extract()?,
        Err(error) => return Err(error),
    };
    // SAFETY: F_GETFD only reads this process's fd table; a bad number gives EBADF.
    if number < 0 || unsafe { libc::fcntl(number, libc::F_GETFD) } < 0 {
        return Err(errors::misuse(format!(
            "fd {number} is not an open file descriptor"
        )));
    }
    Ok(number)
}

/// `number` borrowed for one call.
pub(crate) fn borrowed<'fd>(number: RawFd) -> BorrowedFd<'fd> {
    // SAFETY: `fd_arg` found it open; the caller keeps it open for the call (as documented on
    // every method that takes an fd). Were another thread to close it meanwhile, the library's
    // duplicate or `fstat` of it fails, or its ticket check refuses the file it then names.
    unsafe { BorrowedFd::borrow_raw(number) }
}

/// A sequence of fds (ints, or objects with `fileno()`), each checked open, borrowed for a call.
/// The items are returned too: the caller keeps them for the call, so that an fd an item owns
/// (a file object from a generator, say) is not closed, and its number reused, meanwhile.
pub(crate) fn fd_list_arg<'py, 'fd>(
    fds: &Bound<'py, PyAny>,
) -> PyResult<(Vec<Bound<'py, PyAny>>, Vec<BorrowedFd<'fd>>)> {
    let items: Vec<Bound<'py, PyAny>> = fds.try_iter()?.collect::<PyResult<_>>()?;
    let numbers = items
        .iter()
        .map(|item| Ok(borrowed(fd_arg(item)?)))
        .collect::<PyResult<_>>()?;
    Ok((items, numbers))
}

/// A `shmbroker.GpuHandle` (or anything with its `_pack`) as the wire struct.
pub(crate) fn gpu_handle_arg(handle: &Bound<'_, PyAny>) -> PyResult<shmbroker::GpuHandle> {
    let packed = handle
        .call_method0("_pack")
        .map_err(|_| errors::misuse(format!("{handle:?} is not a shmbroker.GpuHandle")))?;
    let bytes: &[u8] = packed.extract()?;
    bytemuck::try_pod_read_unaligned(bytes).map_err(|_| {
        errors::misuse(format!(
            "a packed GPU handle is {} bytes, not {}",
            size_of::<shmbroker::GpuHandle>(),
            bytes.len()
        ))
    })
}

/// A wire struct as a `shmbroker.GpuHandle` (its kind already checked by the library).
pub(crate) fn gpu_handle_object<'py>(
    py: Python<'py>,
    handle: &shmbroker::GpuHandle,
) -> PyResult<Bound<'py, PyAny>> {
    py.import("shmbroker._gpu")?
        .getattr("GpuHandle")?
        .call_method1("_unpack", (PyBytes::new(py, bytemuck::bytes_of(handle)),))
}

/// The reduction named `name`/// The reduction named `name` (`"sum"`, `"max"`, `"bit_xor"`, `"avg"`, ...; any case).
pub(crate) fn op_arg(name: &str) -> PyResult<ReduceOp> {
    let lower = name.to_ascii_lowercase();
    ReduceOp::ALL
        .into_iter()
        .find(|op| op.name() == lower)
        .ok_or_else(|| {
            let names: Vec<&str> = ReduceOp::ALL.iter().map(|op| op.name()).collect();
            errors::misuse(format!("op {name:?} is none of {}", names.join(", ")))
        })
}

/// The element type of `buffer`: `dtype` when given (`"float32"`, `"bfloat16"`, ... as numpy
/// and torch spell them), otherwise what the buffer's format says (a NumPy array's dtype).
pub(crate) fn dtype_arg(dtype: Option<&str>, buffer: &Bytes) -> PyResult<DType> {
    if let Some(name) = dtype {
        let lower = name.trim_start_matches("torch.").to_ascii_lowercase();
        return DType::ALL
            .into_iter()
            .find(|dtype| dtype.name() == lower)
            .ok_or_else(|| {
                let names: Vec<&str> = DType::ALL.iter().map(|dtype| dtype.name()).collect();
                errors::misuse(format!("dtype {name:?} is none of {}", names.join(", ")))
            });
    }
    let format = buffer.element_format();
    let dtype = match format {
        Some(('b', 1)) => Some(DType::I8),
        Some(('B' | 'c', 1)) => Some(DType::U8),
        Some(('h', 2)) => Some(DType::I16),
        Some(('H', 2)) => Some(DType::U16),
        Some(('i' | 'l', 4)) => Some(DType::I32),
        Some(('I' | 'L', 4)) => Some(DType::U32),
        Some(('l' | 'q' | 'n', 8)) => Some(DType::I64),
        Some(('L' | 'Q' | 'N', 8)) => Some(DType::U64),
        Some(('e', 2)) => Some(DType::F16),
        Some(('f', 4)) => Some(DType::F32),
        Some(('d', 8)) => Some(DType::F64),
        _ => None,
    };
    dtype.ok_or_else(|| {
        errors::misuse(format!(
            "the buffer's format {format:?} is no element type the reductions combine; pass \
             dtype= (bfloat16 buffers, which have no format of their own, always need it)"
        ))
    })
}
