//! `cuda-check` (with `--features cuda`): share device memory between two worker
//! processes through shmbroker, for real, with the CUDA driver loaded at run time.
//!
//! Rank 0 allocates two buffers on device 0 and fills them with a pattern: one with
//! `cuMemAlloc` shared as a legacy IPC handle, one with the VMM API (`cuMemCreate`) exported as
//! a POSIX fd. It broadcasts both as [`GpuHandle`]s (the fd travels through the fd exchange).
//! Rank 1 opens both, copies them back to the host and checks every byte. No CUDA headers or
//! libraries are needed to build this; without a driver it says so and exits 77 (skipped).

use shmbroker::Collectives;
use shmbroker::Session;
use shmbroker::bindings::{GPU_HANDLE_BYTES, GpuHandle, GpuHandleKind};
use std::ffi::{CStr, c_void};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// `cuda-check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The broker's socket.
    #[arg(long)]
    socket: String,
    /// 0 shares the device memory, 1 opens and checks it.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1))]
    rank: u32,
}

/// Runs the check; exits [`NO_DRIVER`] (after saying why) with no usable driver.
pub fn check(args: &Args) -> std::process::ExitCode {
    match run(&args.socket, args.rank) {
        Ok(summary) => {
            println!("cuda-check: {summary}");
            std::process::ExitCode::SUCCESS
        }
        Err(error)
            if error.contains("libcuda.so.1 cannot be loaded") || error.starts_with("cuInit") =>
        {
            eprintln!("cuda-check: skipped: {error}");
            std::process::ExitCode::from(NO_DRIVER)
        }
        Err(error) => {
            eprintln!("cuda-check: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Exit code for "no usable CUDA driver here": 77, the test-suite convention for "skipped" (2
/// is a usage error).
pub const NO_DRIVER: u8 = 77;
const BYTES: usize = 1 << 20;

type CuResult = i32;
type Device = i32;
type DevicePtr = u64;
type Context = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct IpcMemHandle([u8; 64]);

#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    kind: i32, // CU_MEM_LOCATION_TYPE_DEVICE = 1
    id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct AllocFlags {
    compression_type: u8,
    gpu_direct_rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MemAllocationProp {
    kind: i32,                   // CU_MEM_ALLOCATION_TYPE_PINNED = 1
    requested_handle_types: i32, // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
    location: MemLocation,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: AllocFlags,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MemAccessDesc {
    location: MemLocation,
    flags: i32, // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
}

const _: () = assert!(size_of::<MemAllocationProp>() == 32);
const _: () = assert!(size_of::<MemAccessDesc>() == 12);

/// The driver entry points this check uses, looked up by name in `libcuda.so.1`.
struct Cuda {
    init: unsafe extern "C" fn(u32) -> CuResult,
    device_get: unsafe extern "C" fn(*mut Device, i32) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut Context, Device) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(Context) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut DevicePtr, usize) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(DevicePtr, *const c_void, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, DevicePtr, usize) -> CuResult,
    ipc_get_mem_handle: unsafe extern "C" fn(*mut IpcMemHandle, DevicePtr) -> CuResult,
    ipc_open_mem_handle: unsafe extern "C" fn(*mut DevicePtr, IpcMemHandle, u32) -> CuResult,
    granularity: unsafe extern "C" fn(*mut usize, *const MemAllocationProp, i32) -> CuResult,
    mem_create: unsafe extern "C" fn(*mut u64, usize, *const MemAllocationProp, u64) -> CuResult,
    export: unsafe extern "C" fn(*mut c_void, u64, i32, u64) -> CuResult,
    import: unsafe extern "C" fn(*mut u64, *mut c_void, i32) -> CuResult,
    reserve: unsafe extern "C" fn(*mut DevicePtr, usize, usize, DevicePtr, u64) -> CuResult,
    map: unsafe extern "C" fn(DevicePtr, usize, usize, u64, u64) -> CuResult,
    set_access: unsafe extern "C" fn(DevicePtr, usize, *const MemAccessDesc, usize) -> CuResult,
}

/// Looks up `name` in `library` as a function pointer of type `F`.
///
/// # Safety
///
/// `F` must be the function pointer type of the C function `name` exports.
unsafe fn symbol<F: Copy>(library: *mut c_void, name: &CStr) -> Result<F, String> {
    // SAFETY: `library` is a live handle from dlopen and `name` is NUL-terminated.
    let address = unsafe { nix::libc::dlsym(library, name.as_ptr()) };
    if address.is_null() {
        return Err(format!("libcuda.so.1 has no {name:?}"));
    }
    // SAFETY: the caller states `F` is this symbol's function pointer type, and function
    // pointers have the size of a data pointer on the platforms this builds for.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&address) })
}

/// Turns a `CUresult` into an error naming the call.
fn ok(call: &str, result: CuResult) -> Result<(), String> {
    match result {
        0 => Ok(()),
        code => Err(format!("{call} failed with CUresult {code}")),
    }
}

impl Cuda {
    /// Loads the driver and makes device 0's primary context current; `Err` says why CUDA
    /// cannot be used here.
    fn load() -> Result<Self, String> {
        // SAFETY: dlopen takes a NUL-terminated name; the library stays loaded for the process.
        let library = unsafe { nix::libc::dlopen(c"libcuda.so.1".as_ptr(), nix::libc::RTLD_NOW) };
        if library.is_null() {
            return Err("libcuda.so.1 cannot be loaded (no NVIDIA driver on this machine)".into());
        }
        macro_rules! entry {
            ($name:literal) => {{
                // SAFETY: the field's type is the function type the CUDA driver API declares
                // for this entry point.
                unsafe { symbol(library, $name) }?
            }};
        }
        let cuda = Self {
            init: entry!(c"cuInit"),
            device_get: entry!(c"cuDeviceGet"),
            primary_ctx_retain: entry!(c"cuDevicePrimaryCtxRetain"),
            ctx_set_current: entry!(c"cuCtxSetCurrent"),
            mem_alloc: entry!(c"cuMemAlloc_v2"),
            memcpy_htod: entry!(c"cuMemcpyHtoD_v2"),
            memcpy_dtoh: entry!(c"cuMemcpyDtoH_v2"),
            ipc_get_mem_handle: entry!(c"cuIpcGetMemHandle"),
            ipc_open_mem_handle: entry!(c"cuIpcOpenMemHandle_v2"),
            granularity: entry!(c"cuMemGetAllocationGranularity"),
            mem_create: entry!(c"cuMemCreate"),
            export: entry!(c"cuMemExportToShareableHandle"),
            import: entry!(c"cuMemImportFromShareableHandle"),
            reserve: entry!(c"cuMemAddressReserve"),
            map: entry!(c"cuMemMap"),
            set_access: entry!(c"cuMemSetAccess"),
        };
        // SAFETY: cuInit takes flags (must be 0) and touches no memory of ours.
        ok("cuInit", unsafe { (cuda.init)(0) })?;
        let mut device = 0;
        // SAFETY: writes one CUdevice to a live local.
        ok("cuDeviceGet", unsafe { (cuda.device_get)(&mut device, 0) })?;
        let mut context = std::ptr::null_mut();
        // SAFETY: writes one CUcontext to a live local.
        ok("cuDevicePrimaryCtxRetain", unsafe {
            (cuda.primary_ctx_retain)(&mut context, device)
        })?;
        // SAFETY: makes the context just retained current on this thread.
        ok("cuCtxSetCurrent", unsafe {
            (cuda.ctx_set_current)(context)
        })?;
        Ok(cuda)
    }

    fn alloc(&self, size: usize) -> Result<DevicePtr, String> {
        let mut device = 0;
        // SAFETY: writes one CUdeviceptr to a live local.
        ok("cuMemAlloc", unsafe { (self.mem_alloc)(&mut device, size) })?;
        Ok(device)
    }

    fn to_device(&self, device: DevicePtr, bytes: &[u8]) -> Result<(), String> {
        // SAFETY: reads `bytes.len()` bytes from a live slice; `device` holds at least that many
        // (allocated or mapped by this check with that size).
        ok("cuMemcpyHtoD", unsafe {
            (self.memcpy_htod)(device, bytes.as_ptr().cast(), bytes.len())
        })
    }

    fn to_host(&self, bytes: &mut [u8], device: DevicePtr) -> Result<(), String> {
        // SAFETY: writes `bytes.len()` bytes into a live slice from device memory of that size.
        ok("cuMemcpyDtoH", unsafe {
            (self.memcpy_dtoh)(bytes.as_mut_ptr().cast(), device, bytes.len())
        })
    }

    fn ipc_handle(&self, device: DevicePtr) -> Result<IpcMemHandle, String> {
        let mut handle = IpcMemHandle([0; 64]);
        // SAFETY: writes one 64-byte handle to a live local.
        ok("cuIpcGetMemHandle", unsafe {
            (self.ipc_get_mem_handle)(&mut handle, device)
        })?;
        Ok(handle)
    }

    fn ipc_open(&self, handle: IpcMemHandle) -> Result<DevicePtr, String> {
        let mut device = 0;
        // SAFETY: writes one CUdeviceptr to a live local; flag 1 is LAZY_ENABLE_PEER_ACCESS.
        ok("cuIpcOpenMemHandle", unsafe {
            (self.ipc_open_mem_handle)(&mut device, handle, 1)
        })?;
        Ok(device)
    }

    fn granularity(&self, prop: &MemAllocationProp) -> Result<usize, String> {
        let mut granularity = 0;
        // SAFETY: reads a live property struct, writes one size_t to a live local.
        ok("cuMemGetAllocationGranularity", unsafe {
            (self.granularity)(&mut granularity, prop, 0)
        })?;
        Ok(granularity)
    }

    fn create(&self, size: usize, prop: &MemAllocationProp) -> Result<u64, String> {
        let mut allocation = 0;
        // SAFETY: reads a live property struct, writes one handle to a live local.
        ok("cuMemCreate", unsafe {
            (self.mem_create)(&mut allocation, size, prop, 0)
        })?;
        Ok(allocation)
    }

    fn export_fd(&self, allocation: u64) -> Result<OwnedFd, String> {
        let mut fd: i32 = -1;
        // SAFETY: for the POSIX fd handle type (1) the driver writes one int to the pointer.
        ok("cuMemExportToShareableHandle", unsafe {
            (self.export)((&mut fd as *mut i32).cast(), allocation, 1, 0)
        })?;
        // SAFETY: the driver just created this fd for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn import_fd(&self, fd: &OwnedFd) -> Result<u64, String> {
        let mut allocation = 0;
        // SAFETY: for the POSIX fd handle type (1) the driver takes the fd as the pointer value
        // and writes one handle to a live local; it duplicates what it keeps.
        ok("cuMemImportFromShareableHandle", unsafe {
            (self.import)(&mut allocation, fd.as_raw_fd() as isize as *mut c_void, 1)
        })?;
        Ok(allocation)
    }

    /// Reserves an address range of `size` and maps `allocation` there read-write on device 0.
    fn map_vmm(&self, allocation: u64, size: usize) -> Result<DevicePtr, String> {
        let mut address = 0;
        // SAFETY: writes one CUdeviceptr to a live local.
        ok("cuMemAddressReserve", unsafe {
            (self.reserve)(&mut address, size, 0, 0, 0)
        })?;
        // SAFETY: maps the whole allocation at the range just reserved for it.
        ok("cuMemMap", unsafe {
            (self.map)(address, size, 0, allocation, 0)
        })?;
        let access = MemAccessDesc {
            location: MemLocation { kind: 1, id: 0 },
            flags: 3,
        };
        // SAFETY: reads one live access descriptor.
        ok("cuMemSetAccess", unsafe {
            (self.set_access)(address, size, &access, 1)
        })?;
        Ok(address)
    }

    fn prop() -> MemAllocationProp {
        MemAllocationProp {
            kind: 1,
            requested_handle_types: 1,
            location: MemLocation { kind: 1, id: 0 },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: AllocFlags {
                compression_type: 0,
                gpu_direct_rdma_capable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }
}

fn pattern(salt: u8) -> Vec<u8> {
    (0..BYTES)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

fn handle_of(
    kind: GpuHandleKind,
    handle: [u8; GPU_HANDLE_BYTES],
    size: usize,
    id: u64,
) -> GpuHandle {
    GpuHandle {
        kind: kind as u32,
        flags: 0,
        device_uuid: [0; 16],
        handle,
        size: size as u64,
        offset: 0,
        buffer_id: id,
    }
}

/// Runs the check as `rank` 0 (exporter) or 1 (importer); returns what was verified.
pub fn run(socket: &str, rank: u32) -> Result<String, String> {
    let cuda = Cuda::load()?;
    let mut session =
        Session::connect(socket, Some(rank), Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let fail = |e: shmbroker::Error| e.to_string();
    if rank == 0 {
        // Legacy IPC: cuMemAlloc + cuIpcGetMemHandle.
        let device = cuda.alloc(BYTES)?;
        cuda.to_device(device, &pattern(1))?;
        let ipc = cuda.ipc_handle(device)?;
        let handle = handle_of(GpuHandleKind::CudaIpcMemory, ipc.0, BYTES, 1);
        session
            .broadcast_gpu_handle(0, Some((&handle, None)))
            .map_err(fail)?;
        // VMM: cuMemCreate, mapped here to fill it, exported as a POSIX fd.
        let prop = Cuda::prop();
        let size = BYTES.next_multiple_of(cuda.granularity(&prop)?.max(1));
        let allocation = cuda.create(size, &prop)?;
        let address = cuda.map_vmm(allocation, size)?;
        cuda.to_device(address, &pattern(2))?;
        let fd = cuda.export_fd(allocation)?;
        let handle = handle_of(
            GpuHandleKind::CudaVmmPosixFd,
            [0; GPU_HANDLE_BYTES],
            size,
            2,
        );
        session
            .broadcast_gpu_handle(0, Some((&handle, Some(fd.as_fd()))))
            .map_err(fail)?;
        // Everything stays alive until the importer has checked.
        session.barrier().map_err(fail)?;
        Ok(format!(
            "rank 0 exported a legacy IPC handle and a VMM POSIX fd of {BYTES} bytes each"
        ))
    } else {
        let mut back = vec![0u8; BYTES];
        let (handle, _) = session.broadcast_gpu_handle(0, None).map_err(fail)?;
        let device = cuda.ipc_open(IpcMemHandle(handle.handle))?;
        cuda.to_host(&mut back, device)?;
        if back != pattern(1) {
            return Err("legacy IPC: the device memory read back differs".into());
        }
        let (handle, fd) = session.broadcast_gpu_handle(0, None).map_err(fail)?;
        let fd = fd.ok_or("the VMM handle came without its fd")?;
        let allocation = cuda.import_fd(&fd)?;
        let address = cuda.map_vmm(allocation, handle.size as usize)?;
        cuda.to_host(&mut back, address)?;
        if back != pattern(2) {
            return Err("VMM POSIX fd: the device memory read back differs".into());
        }
        session.barrier().map_err(fail)?;
        Ok(format!(
            "rank 1 opened both handles and verified {BYTES} bytes of each"
        ))
    }
}
