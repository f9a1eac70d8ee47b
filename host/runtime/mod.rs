//! Devices, their primary contexts, and dlkern's kernels loaded on them.
//!
//! [`Device::get`] retains the device's *primary* context (the one the CUDA runtime, PyTorch
//! and ONNX Runtime use), so dlkern's launches and theirs share one context and one address
//! space. Each device loads dlkern's PTX module once, lazily, on first launch; function handles
//! are cached. All of it is thread-safe.

mod driver;
mod params;
pub mod ptx;
pub mod tensor_map;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{CUdevice_attribute, CUfunction, CUfunction_attribute, CUstream};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

pub use driver::driver_available;
use driver::guarded;
pub use params::KernelParams;

use crate::error::{DriverContext, Error, Result};

/// Number of CUDA devices, or an error without a driver.
pub fn device_count() -> Result<usize> {
    guarded("device_count", || CudaContext::device_count().during("cuDeviceGetCount").map(|n| n.max(0) as usize))
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

/// A CUDA device with dlkern's kernels: its primary context, the PTX module chosen for its
/// architecture (loaded on first use) and a cache of function handles.
pub struct Device {
    ctx: Arc<CudaContext>,
    name: String,
    compute_capability: (i32, i32),
    ptx: ptx::Module,
    /// The loaded module, and whether it came from the cubin (else from the PTX).
    module: OnceLock<(Arc<CudaModule>, bool)>,
    module_init: Mutex<()>,
    /// The kernels launched so far: handle, raised shared memory limit and occupancy, all under
    /// one lock so that a launch looks its kernel up once.
    kernels: Mutex<Kernels>,
    /// [`Device::stream_workspace`]'s buffers by stream, and the ones they outgrew (kept: a call
    /// on another thread may still be about to launch on one).
    stream_workspaces: Mutex<(HashMap<usize, DeviceBuffer>, Vec<DeviceBuffer>)>,
    max_shared_optin: u32,
    multiprocessors: u32,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ctx.ordinal())
            .field("name", &self.name)
            .field("compute_capability", &self.compute_capability)
            .field("module", &self.ptx.target())
            .finish()
    }
}

impl Device {
    /// The device with this ordinal, created once per process and shared.
    ///
    /// Errors (never panics) when there is no driver, no such device, or the GPU is older than
    /// compute capability 8.0.
    pub fn get(ordinal: usize) -> Result<Arc<Device>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();
        let devices = DEVICES.get_or_init(Default::default);
        let mut devices = devices.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(device) = devices.get(&ordinal) {
            return Ok(device.clone());
        }
        let device = Arc::new(guarded("Device::get", || Device::open(ordinal))?);
        devices.insert(ordinal, device.clone());
        Ok(device)
    }

    /// The device of the calling thread's current CUDA context (as ONNX Runtime or PyTorch left
    /// it), or device 0 when no context is current.
    pub fn current() -> Result<Arc<Device>> {
        let ordinal = guarded("Device::current", || {
            let ctx = cudarc::driver::result::ctx::get_current().during("cuCtxGetCurrent")?;
            if ctx.is_none() {
                return Ok(0);
            }
            let mut device = 0;
            // SAFETY: a context is current; cuCtxGetDevice writes one CUdevice.
            unsafe { cudarc::driver::sys::cuCtxGetDevice(&mut device) }.result().during("cuCtxGetDevice")?;
            Ok(device.max(0) as usize)
        })?;
        Device::get(ordinal)
    }

    fn open(ordinal: usize) -> Result<Device> {
        let count = CudaContext::device_count().during("cuDeviceGetCount")?.max(0) as usize;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).during("cuDevicePrimaryCtxRetain")?;
        let name = ctx.name().during("cuDeviceGetName")?;
        let (major, minor) = ctx.compute_capability().during("cuDeviceGetAttribute")?;
        let ptx =
            ptx::select(major, minor).ok_or_else(|| Error::UnsupportedGpu { name: name.clone(), major, minor })?;
        let max_shared_optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .during("cuDeviceGetAttribute")?
            .max(0) as u32;
        let multiprocessors = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("cuDeviceGetAttribute")?
            .max(1) as u32;
        keep_pool_memory(&ctx)?;
        Ok(Device::on_module(ctx, name, (major, minor), ptx, max_shared_optin, multiprocessors))
    }

    /// A device running `ptx`, with nothing loaded yet.
    fn on_module(
        ctx: Arc<CudaContext>,
        name: String,
        compute_capability: (i32, i32),
        ptx: ptx::Module,
        max_shared_optin: u32,
        multiprocessors: u32,
    ) -> Device {
        Device {
            multiprocessors,
            ctx,
            name,
            compute_capability,
            ptx,
            module: OnceLock::new(),
            module_init: Mutex::new(()),
            kernels: Mutex::new(Kernels::default()),
            stream_workspaces: Mutex::new((HashMap::new(), Vec::new())),
            max_shared_optin,
        }
    }

    /// This device with the kernels of another PTX module instead of dlkern's: the one in
    /// `modules` (a table as `dlkern-builder` writes it: sm number, arch-specific, PTX text,
    /// cubin) for the target of the module this device runs ([`Device::module_arch`]), loaded
    /// on its first launch. For modules built beside dlkern's but kept out of the library, such as the
    /// device self-tests that the tests and benches load. The handle shares this device's
    /// primary context and launches as [`Device::launch`] does.
    pub fn with_module(&self, modules: &[ptx::TableEntry]) -> Result<Device> {
        let target = (self.ptx.arch, self.ptx.arch_specific);
        let Some(ptx) = modules.iter().map(ptx::Module::of).find(|m| (m.arch, m.arch_specific) == target) else {
            let message = format!("no PTX module for {} among {} given", self.ptx.target(), modules.len());
            return Err(Error::invalid("Device::with_module", message));
        };
        let (ctx, name) = (self.ctx.clone(), self.name.clone());
        Ok(Device::on_module(ctx, name, self.compute_capability, ptx, self.max_shared_optin, self.multiprocessors))
    }

    /// The primary context (cudarc), for allocations, streams and copies.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Marketing name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The `sm_XY` number of the PTX module this device runs.
    pub fn module_arch(&self) -> u32 {
        self.ptx.arch
    }

    /// Whether the module was loaded from its cubin (machine code the build assembled) rather
    /// than JIT-compiled from its PTX; `None` before the first launch loads it.
    pub fn module_from_cubin(&self) -> Option<bool> {
        self.module.get().map(|&(_, from_cubin)| from_cubin)
    }

    /// Whether this device runs the Hopper-specific module (`sm_90a`), whose extra kernels use
    /// `wgmma`.
    pub fn has_wgmma(&self) -> bool {
        self.ptx.arch_specific && self.ptx.arch == 90
    }

    /// Whether [`Device::launch_overlapping`] makes programmatic dependent launches here: where
    /// the device runs the sm_90a module, whose kernels have `griddepcontrol`.
    pub fn overlaps_launches(&self) -> bool {
        self.ptx.arch_specific && self.ptx.arch >= 90
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// Largest dynamic shared memory one block may opt in to, in bytes.
    pub fn max_shared_bytes_per_block(&self) -> u32 {
        self.max_shared_optin
    }

    fn module(&self) -> Result<&Arc<CudaModule>> {
        if let Some((module, _)) = self.module.get() {
            return Ok(module);
        }
        // One thread loads the module (a JIT compile, from PTX); others wait rather than load it again.
        let _guard = self.module_init.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((module, _)) = self.module.get() {
            return Ok(module);
        }
        let (major, minor) = self.compute_capability;
        // The cubin where this GPU runs it; the PTX (JIT-compiled by the driver) where it does
        // not, where the driver refuses it (one from a newer ptxas than it accepts, say), or
        // where `DLKERN_LOAD_PTX` asks for the PTX.
        let cubin = if ptx_forced() { None } else { self.ptx.cubin_for(major, minor) };
        let from_cubin = cubin.and_then(|cubin| {
            guarded("load cubin", || self.ctx.load_module(Ptx::from_binary(cubin.to_vec())).during("cuModuleLoadData"))
                .ok()
        });
        let loaded = match from_cubin {
            Some(module) => (module, true),
            None => {
                let text = self.ptx.text;
                let ptx = || self.ctx.load_module(Ptx::from_src(text)).during("cuModuleLoadData");
                (guarded("load PTX module", ptx)?, false)
            }
        };
        Ok(&self.module.get_or_init(|| loaded).0)
    }

    /// The handle of kernel `name`, loading the module on first use.
    pub fn function(&self, name: &'static str) -> Result<Arc<CudaFunction>> {
        let mut kernels = self.kernels.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = self.slot(&mut kernels, name)?;
        Ok(kernels.slots[slot].function.clone())
    }

    /// How many blocks of kernel `name` launched with `dims`' block and dynamic shared memory
    /// one SM holds at once (`cuOccupancyMaxActiveBlocksPerMultiprocessor`), cached.
    pub fn resident_blocks_per_sm(&self, name: &'static str, dims: &LaunchDims) -> Result<u32> {
        self.check_dims(name, dims)?;
        Ok(self.launchable(name, dims, true)?.1)
    }

    /// Kernel `name`'s slot in `kernels`, its handle loaded on first use.
    fn slot(&self, kernels: &mut Kernels, name: &'static str) -> Result<usize> {
        kernels.slot_or_insert(name, || {
            let module = self.module()?;
            Ok(Arc::new(guarded("load kernel", || module.load_function(name).during("cuModuleGetFunction"))?))
        })
    }

    /// Kernel `name`'s raw handle for a launch with `dims` (checked by [`Device::check_dims`]),
    /// its dynamic shared memory limit raised to `dims.shared_bytes` where that is above the
    /// default 48 KiB (once: `cuFuncSetAttribute` on every launch would be a driver call each),
    /// and, with `occupancy`, how many such blocks one SM holds (else 0). One lock and one
    /// lookup per launch: the handle stays valid while the device lives (its module is never
    /// unloaded and the slot never dropped).
    fn launchable(&self, name: &'static str, dims: &LaunchDims, occupancy: bool) -> Result<(CUfunction, u32)> {
        let mut kernels = self.kernels.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = self.slot(&mut kernels, name)?;
        let slot = &mut kernels.slots[slot];
        if dims.shared_bytes > 48 * 1024 && slot.shared_limit < dims.shared_bytes {
            slot.function
                .set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dims.shared_bytes as i32,
                )
                .during("cuFuncSetAttribute")?;
            slot.shared_limit = dims.shared_bytes;
        }
        let (bx, by, bz) = dims.block;
        let threads = bx * by * bz;
        let known = if occupancy {
            slot.occupancy.iter().find(|&&(t, s, _)| (t, s) == (threads, dims.shared_bytes)).map(|e| e.2)
        } else {
            Some(0)
        };
        let blocks = match known {
            Some(blocks) => blocks,
            None => {
                let function = &slot.function;
                let blocks = guarded("occupancy", || {
                    self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
                    function
                        .occupancy_max_active_blocks_per_multiprocessor(threads, dims.shared_bytes as usize, None)
                        .during("cuOccupancyMaxActiveBlocksPerMultiprocessor")
                })?;
                slot.occupancy.push((threads, dims.shared_bytes, blocks));
                blocks
            }
        };
        Ok((slot.function.cu_function(), blocks))
    }

    /// At least `bytes` of device memory kept for `stream` across calls, zero when first handed
    /// out: for kernels that need a workspace whose counters start at zero and that leave them
    /// zero when they end, so that a call needs neither an allocation nor a clearing launch
    /// (GroupQueryAttention's one-launch decode). Calls on one stream run in its order, so they
    /// can share it; a call needing more gets a new, larger buffer (zeroed in `stream` order)
    /// and the old one is kept until the process ends. Not for CUDA-graph captures: a graph
    /// would keep the address, replays on other streams would share it.
    ///
    /// # Safety
    /// `stream` is a live stream of this device's primary context (or null), and only kernels
    /// launched on it use the memory, each leaving zero whatever it found zero.
    pub unsafe fn stream_workspace(&self, stream: CUstream, bytes: usize) -> Result<u64> {
        let mut guard = self.stream_workspaces.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (buffers, outgrown) = &mut *guard;
        let key = stream as usize;
        if let Some(buffer) = buffers.get(&key).filter(|b| b.bytes() >= bytes) {
            return Ok(buffer.address());
        }
        let size = bytes.max(64 << 10).next_power_of_two();
        let buffer = DeviceBuffer::new(self, size)?;
        // SAFETY: the new buffer's whole extent, on the caller's stream.
        unsafe { memset_async(self, stream, buffer.address(), 0, size)? };
        let address = buffer.address();
        if let Some(old) = buffers.insert(key, buffer) {
            outgrown.push(old);
        }
        Ok(address)
    }

    /// Checks `dims` against the device limits.
    fn check_dims(&self, kernel: &'static str, dims: &LaunchDims) -> Result<()> {
        let (bx, by, bz) = dims.block;
        let threads = bx as u64 * by as u64 * bz as u64;
        if threads == 0 || threads > 1024 {
            return Err(Error::LaunchLimit { kernel, message: format!("block of {threads} threads (1..=1024)") });
        }
        let (gx, gy, gz) = dims.grid;
        if gx == 0 || gy == 0 || gz == 0 || gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
            return Err(Error::LaunchLimit { kernel, message: format!("grid {:?}", dims.grid) });
        }
        if dims.shared_bytes > self.max_shared_optin {
            return Err(Error::LaunchLimit {
                kernel,
                message: format!(
                    "{} bytes of shared memory, device allows {}",
                    dims.shared_bytes, self.max_shared_optin
                ),
            });
        }
        Ok(())
    }

    /// Launches kernel `name` on `stream` with the given parameters.
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list exactly (count, order, types), and every
    /// pointer among them must satisfy the kernel's launch contract for the whole time the
    /// kernel runs. `stream` must belong to this device's primary context (or be null, the
    /// legacy default stream).
    pub unsafe fn launch(
        &self,
        name: &'static str,
        dims: LaunchDims,
        stream: CUstream,
        params: KernelParams,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.launch_with(name, dims, None, stream, params, Overlap::Never) }
    }

    /// [`Device::launch`] as a programmatic dependent launch where the device runs the sm_90a
    /// module: the kernel's blocks may start while the previous kernel in `stream` still runs
    /// (once that one's blocks executed `griddepcontrol.launch_dependents` or exited), which
    /// hides the launch latency and lets the kernel's prologue overlap the previous kernel's
    /// tail. Elsewhere a plain launch: the portable module's kernels have no
    /// `griddepcontrol.wait` (newer GPUs than Hopper run that module too).
    ///
    /// # Safety
    /// As [`Device::launch`], and the kernel must execute `griddepcontrol.wait` before it reads
    /// anything the previous kernel in the stream writes, or writes anything that one reads.
    pub unsafe fn launch_overlapping(
        &self,
        name: &'static str,
        dims: LaunchDims,
        stream: CUstream,
        params: KernelParams,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.launch_with(name, dims, None, stream, params, Overlap::Always) }
    }

    /// [`Device::launch_overlapping`] for a grid that fits in one wave of resident blocks,
    /// [`Device::launch`] for a larger one. A programmatic dependent's every block passes
    /// `griddepcontrol.wait` once it starts; in one wave the blocks wait together while the
    /// previous kernel ends, but wave after wave the wait comes back: measured on the H100
    /// (2026-12-05, onnxruntime-gpu nodes), a 2048-row fused norm ran 30.8 us instead of ~20 and
    /// GroupQueryAttention's rotary launch over a 2048-token prompt (98,304 small blocks) 119 us
    /// instead of 66 as dependents, while decode-sized grids gained.
    ///
    /// # Safety
    /// As [`Device::launch_overlapping`].
    pub unsafe fn launch_overlapping_in_one_wave(
        &self,
        name: &'static str,
        dims: LaunchDims,
        stream: CUstream,
        params: KernelParams,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.launch_with(name, dims, None, stream, params, Overlap::InOneWave) }
    }

    /// [`Device::launch`] (or, with `overlap`, [`Device::launch_overlapping`]) in thread-block
    /// clusters of `cluster` blocks (compute capability 9.0 and later): each cluster's blocks
    /// run at once and may read each other's shared memory. At most 8 blocks per cluster (the
    /// portable size), and the grid must be a whole number of clusters.
    ///
    /// # Safety
    /// As [`Device::launch_overlapping`] when `overlap`, else as [`Device::launch`]; the kernel
    /// must take clusters of this shape.
    pub unsafe fn launch_clustered(
        &self,
        name: &'static str,
        dims: LaunchDims,
        cluster: (u32, u32, u32),
        stream: CUstream,
        params: KernelParams,
        overlap: bool,
    ) -> Result<()> {
        let (cx, cy, cz) = cluster;
        let blocks = cx as u64 * cy as u64 * cz as u64;
        let (gx, gy, gz) = dims.grid;
        if !(1..=8).contains(&blocks) || [(gx, cx), (gy, cy), (gz, cz)].iter().any(|&(g, c)| c == 0 || g % c != 0) {
            let message = format!("cluster {cluster:?} for grid {:?} (1 to 8 blocks dividing the grid)", dims.grid);
            return Err(Error::LaunchLimit { kernel: name, message });
        }
        if self.compute_capability.0 < 9 {
            let message =
                format!("clusters need compute capability 9.0, {} has {:?}", self.name, self.compute_capability);
            return Err(Error::LaunchLimit { kernel: name, message });
        }
        let overlap = if overlap { Overlap::Always } else { Overlap::Never };
        // SAFETY: forwarded contract.
        unsafe { self.launch_with(name, dims, Some(cluster), stream, params, overlap) }
    }

    /// # Safety
    /// As [`Device::launch_clustered`] when `cluster` is given, else as
    /// [`Device::launch_overlapping`] unless `overlap` is [`Overlap::Never`], else as
    /// [`Device::launch`].
    unsafe fn launch_with(
        &self,
        name: &'static str,
        dims: LaunchDims,
        cluster: Option<(u32, u32, u32)>,
        stream: CUstream,
        mut params: KernelParams,
        mode: Overlap,
    ) -> Result<()> {
        if params.overflowed() {
            return Err(Error::invalid(name, "more kernel parameters than a launch list holds"));
        }
        self.check_dims(name, &dims)?;
        let overlaps = self.overlaps_launches();
        let (raw, resident) = self.launchable(name, &dims, overlaps && mode == Overlap::InOneWave)?;
        let (gx, gy, gz) = dims.grid;
        let overlap = overlaps
            && match mode {
                Overlap::Never => false,
                Overlap::Always => true,
                Overlap::InOneWave => {
                    gx as u64 * gy as u64 * gz as u64 <= resident as u64 * self.multiprocessors as u64
                }
            };
        let mut pointers = params.raw();
        guarded("launch", || {
            self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
            // Every launch is a `cuLaunchKernelEx`, with no attributes where it needs none:
            // measured on the H200 (benches/host_cost.rs) cheaper on the host than
            // `cuLaunchKernel` for the same kernel.
            use cudarc::driver::sys::{
                CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue,
                CUlaunchAttributeValue_union__bindgen_ty_1, CUlaunchConfig, cuLaunchKernelEx,
            };
            let mut attributes = [CUlaunchAttribute {
                id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
            }; 2];
            let mut count = usize::from(overlap);
            if let Some((x, y, z)) = cluster {
                attributes[count] = CUlaunchAttribute {
                    id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                    pad: [0; 4],
                    value: CUlaunchAttributeValue {
                        clusterDim: CUlaunchAttributeValue_union__bindgen_ty_1 { x, y, z },
                    },
                };
                count += 1;
            }
            let config = CUlaunchConfig {
                gridDimX: dims.grid.0,
                gridDimY: dims.grid.1,
                gridDimZ: dims.grid.2,
                blockDimX: dims.block.0,
                blockDimY: dims.block.1,
                blockDimZ: dims.block.2,
                sharedMemBytes: dims.shared_bytes,
                hStream: stream,
                attrs: attributes.as_mut_ptr(),
                numAttrs: count as u32,
            };
            // SAFETY: the caller guarantees the parameters and the stream; dims were checked.
            // `pointers` points into `params`, and `config` and `attributes` live until the
            // call returns.
            unsafe { cuLaunchKernelEx(&config, raw, pointers.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
                .during("cuLaunchKernelEx")
        })
    }
}

/// Whether a launch is a programmatic dependent (where the device's module has
/// `griddepcontrol`, [`Device::overlaps_launches`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Overlap {
    Never,
    Always,
    /// Where its grid fits in one wave of resident blocks ([`Device::launch_overlapping_in_one_wave`]).
    InOneWave,
}

/// A kernel name's address and length: launches find their kernel by these two words instead
/// of hashing and comparing its text.
#[derive(Clone, Copy, PartialEq, Eq)]
struct NameKey(usize, usize);

impl NameKey {
    fn of(name: &'static str) -> Self {
        NameKey(name.as_ptr() as usize, name.len())
    }
}

/// A device's kernels. A process launches a few dozen at most, so a list scanned by address
/// beats a hash map (one with SipHash over a name cost ~30 ns a lookup here, and a launch made
/// three). `F` is the handle (a type of its own in the unit tests, which have no driver).
struct Kernels<F = Arc<CudaFunction>> {
    /// Name addresses to slots; two copies of one name at different addresses share a slot.
    index: Vec<(NameKey, usize)>,
    slots: Vec<KernelSlot<F>>,
}

impl<F> Default for Kernels<F> {
    fn default() -> Self {
        Kernels { index: Vec::new(), slots: Vec::new() }
    }
}

impl<F> Kernels<F> {
    /// The slot of kernel `name`: found by its address, else by its text (the same name at
    /// another address shares the slot, so the shared memory limit it records stays the
    /// function's), else a new one with the handle `load` gives.
    fn slot_or_insert(&mut self, name: &'static str, load: impl FnOnce() -> Result<F>) -> Result<usize> {
        let key = NameKey::of(name);
        if let Some(&(_, slot)) = self.index.iter().find(|(k, _)| *k == key) {
            return Ok(slot);
        }
        let slot = match self.slots.iter().position(|s| s.name == name) {
            Some(slot) => slot,
            None => {
                self.slots.push(KernelSlot { name, function: load()?, shared_limit: 0, occupancy: Vec::new() });
                self.slots.len() - 1
            }
        };
        self.index.push((key, slot));
        Ok(slot)
    }
}

struct KernelSlot<F> {
    name: &'static str,
    function: F,
    /// The dynamic shared memory limit raised so far (0: the default 48 KiB).
    shared_limit: u32,
    /// Resident blocks per SM by threads per block and dynamic shared bytes.
    occupancy: Vec<(u32, u32, u32)>,
}

/// Whether `DLKERN_LOAD_PTX` asks devices to load the PTX even where the build's cubin would
/// run: set to anything but empty or `0`. For comparing the driver's JIT compile with the
/// build's `ptxas` (one binary, two runs), or for stepping around a cubin.
pub fn ptx_forced() -> bool {
    ptx_forced_by(std::env::var_os("DLKERN_LOAD_PTX").as_deref())
}

fn ptx_forced_by(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0")
}

/// Lets the device's default memory pool (where [`StreamScratch`] allocates) keep what calls
/// free instead of returning it to the system at every synchronization (the default threshold
/// is 0): otherwise each call's workspace is mapped and unmapped again, which cost ~200 us per
/// GroupQueryAttention call on the H200, more than the decode kernels themselves. The pool
/// keeps at most the largest set of workspaces alive at once.
fn keep_pool_memory(ctx: &CudaContext) -> Result<()> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: plain queries/settings on a valid device; `threshold` outlives the call.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result().during("cuDeviceGetDefaultMemPool")?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .during("cuMemPoolSetAttribute")?;
    }
    Ok(())
}

/// Device memory for one launch, allocated and freed in `stream` order (`cuMemAllocAsync` /
/// `cuMemFreeAsync`), for kernels that need a workspace when the caller only hands over a raw
/// stream (the registry, ONNX Runtime). Zero bytes allocate nothing.
pub struct StreamScratch {
    ptr: u64,
    stream: CUstream,
    ctx: Arc<CudaContext>,
}

impl StreamScratch {
    /// # Safety
    /// `stream` must be a live stream of `device`'s primary context (or null, the legacy
    /// default stream) and must outlive the scratch (it is freed on that stream when dropped).
    pub unsafe fn new(device: &Device, stream: CUstream, bytes: usize) -> Result<Self> {
        let ctx = device.context().clone();
        let mut ptr = 0;
        if bytes > 0 {
            guarded("allocate workspace", || {
                ctx.bind_to_thread().during("cuCtxSetCurrent")?;
                // SAFETY: a plain allocation on a stream of this context (the caller's contract).
                unsafe { cudarc::driver::result::malloc_async(stream, bytes) }.during("cuMemAllocAsync")
            })
            .map(|p| ptr = p)?;
        }
        Ok(StreamScratch { ptr, stream, ctx })
    }

    /// The device address (0 when empty).
    pub fn address(&self) -> u64 {
        self.ptr
    }
}

impl Drop for StreamScratch {
    fn drop(&mut self) {
        if self.ptr != 0 && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated above on this stream; freed after the work queued before it.
            // A failure here cannot be reported from drop and at worst leaks the block.
            let _ = unsafe { cudarc::driver::result::free_async(self.ptr, self.stream) };
        }
    }
}

/// Device memory that outlives calls (what a kernel keeps for an ONNX node): allocated with
/// `cuMemAlloc` and freed with `cuMemFree`, which waits for the device's work in flight, so no
/// launch still queued can read the block after it is gone.
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    /// `bytes` (at least 1) of uninitialized device memory in `device`'s primary context.
    pub fn new(device: &Device, bytes: usize) -> Result<Self> {
        let ctx = device.context().clone();
        let ptr = guarded("allocate device buffer", || {
            ctx.bind_to_thread().during("cuCtxSetCurrent")?;
            // SAFETY: a plain allocation in this context.
            unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) }.during("cuMemAlloc")
        })?;
        HELD_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(DeviceBuffer { ptr, bytes, ctx })
    }

    /// The device address.
    pub fn address(&self) -> u64 {
        self.ptr
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} bytes at {:#x} on device {})", self.bytes, self.ptr, self.ctx.ordinal())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc above and freed once. A failure here cannot be
            // reported from drop and at worst leaks the block.
            let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
        }
        HELD_BYTES.fetch_sub(self.bytes as u64, Ordering::Relaxed);
    }
}

static HELD_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes of device memory in live [`DeviceBuffer`]s: what dlkern keeps between calls (the
/// repacked weights of ONNX nodes), over all devices.
pub fn device_bytes_held() -> u64 {
    HELD_BYTES.load(Ordering::Relaxed)
}

/// Waits for the work queued on `stream` (a raw handle, as the registry gets it).
///
/// # Safety
/// `stream` must be a live stream of `device`'s primary context (or null, the legacy default
/// stream).
pub unsafe fn synchronize_stream(device: &Device, stream: CUstream) -> Result<()> {
    guarded("synchronize stream", || {
        device.context().bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: the caller's contract.
        unsafe { cudarc::driver::result::stream::synchronize(stream) }.during("cuStreamSynchronize")
    })
}

/// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`): what an op
/// that must read results back to the host during a call checks first, so that it refuses the
/// capture with a clear error instead of invalidating it.
///
/// # Safety
/// `stream` as in [`synchronize_stream`].
pub unsafe fn stream_is_capturing(device: &Device, stream: CUstream) -> Result<bool> {
    use cudarc::driver::sys::{CUstreamCaptureStatus, cuStreamIsCapturing};
    guarded("query stream capture", || {
        device.context().bind_to_thread().during("cuCtxSetCurrent")?;
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the caller's contract; `status` outlives the call.
        unsafe { cuStreamIsCapturing(stream, &mut status) }.result().during("cuStreamIsCapturing")?;
        Ok(status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    })
}

/// Fills `bytes` bytes at `ptr` with `value`, in `stream` order.
///
/// # Safety
/// `ptr` valid for `bytes` writable bytes of `device`; `stream` as in [`synchronize_stream`].
pub unsafe fn memset_async(device: &Device, stream: CUstream, ptr: u64, value: u8, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    guarded("memset", || {
        device.context().bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: the caller's contract.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, value, bytes, stream) }.during("cuMemsetD8Async")
    })
}

/// Copies `bytes` bytes from `src` to `dst` (device memory, not overlapping), in `stream` order.
///
/// # Safety
/// Both ranges valid on `device`; `stream` as in [`synchronize_stream`].
pub unsafe fn copy_async(device: &Device, stream: CUstream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    guarded("device copy", || {
        device.context().bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: the caller's contract.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream) }.during("cuMemcpyDtoDAsync")
    })
}

/// Waits for `stream`, then reads the u32 at `ptr`.
///
/// # Safety
/// `ptr` a valid, 4-byte aligned device address of `device`; `stream` as in
/// [`synchronize_stream`].
pub unsafe fn read_u32(device: &Device, stream: CUstream, ptr: u64) -> Result<u32> {
    // SAFETY: forwarded.
    unsafe { synchronize_stream(device, stream)? };
    guarded("read status", || {
        let mut word = [0u32];
        // SAFETY: the caller's contract; the stream's work that writes it has finished.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut word, ptr) }.during("cuMemcpyDtoH")?;
        Ok(word[0])
    })
}

/// Copies `rows` rows of `row_bytes` bytes from `src` (rows `src_pitch` bytes apart) to `dst`
/// (rows `dst_pitch` bytes apart), device memory not overlapping, in `stream` order: the copy
/// engine's strided copy (a KV cache into a longer one).
///
/// # Safety
/// Both strided ranges valid on `device`; `stream` as in [`synchronize_stream`].
pub unsafe fn copy_2d_async(
    device: &Device,
    stream: CUstream,
    (dst, dst_pitch): (u64, usize),
    (src, src_pitch): (u64, usize),
    row_bytes: usize,
    rows: usize,
) -> Result<()> {
    use cudarc::driver::sys;
    if row_bytes == 0 || rows == 0 {
        return Ok(());
    }
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: row_bytes,
        Height: rows,
    };
    guarded("strided device copy", || {
        device.context().bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: the caller's contract; `copy` lives through the call (the driver reads it then).
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) }.result().during("cuMemcpy2DAsync")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name with the same text as `name` at an address of its own.
    fn copy_of(name: &str) -> &'static str {
        Box::leak(name.to_string().into_boxed_str())
    }

    #[test]
    fn a_kernel_is_loaded_once_and_copies_of_its_name_share_its_slot() {
        let mut kernels = Kernels::<u32>::default();
        let loads = std::cell::Cell::new(0);
        let load = |handle: u32| {
            let loads = &loads;
            move || {
                loads.set(loads.get() + 1);
                Ok(handle)
            }
        };
        let (a, b) = (copy_of("kernel_a"), copy_of("kernel_b"));
        let a_again = copy_of(a);
        assert_ne!(a.as_ptr(), a_again.as_ptr());
        assert_eq!(kernels.slot_or_insert(a, load(10)).unwrap(), 0);
        assert_eq!(kernels.slot_or_insert(b, load(20)).unwrap(), 1);
        assert_eq!(kernels.slot_or_insert(a, load(99)).unwrap(), 0);
        assert_eq!(kernels.slot_or_insert(a_again, load(99)).unwrap(), 0, "same text, same slot");
        assert_eq!(kernels.slot_or_insert(a_again, load(99)).unwrap(), 0);
        assert_eq!(loads.get(), 2, "one load per name");
        assert_eq!(kernels.slots.iter().map(|s| s.function).collect::<Vec<_>>(), [10, 20]);
        assert_eq!(kernels.index.len(), 3, "the second address is indexed too");
    }

    #[test]
    fn dlkern_load_ptx_is_on_when_set_to_anything_but_empty_or_zero() {
        use std::ffi::OsStr;
        assert!(!ptx_forced_by(None));
        assert!(!ptx_forced_by(Some(OsStr::new(""))));
        assert!(!ptx_forced_by(Some(OsStr::new("0"))));
        assert!(ptx_forced_by(Some(OsStr::new("1"))));
        assert!(ptx_forced_by(Some(OsStr::new("yes"))));
    }

    #[test]
    fn a_failed_load_leaves_no_slot() {
        let mut kernels = Kernels::<u32>::default();
        let name = copy_of("missing");
        let failed = kernels.slot_or_insert(name, || Err(Error::invalid("test", "no such kernel")));
        assert!(failed.is_err());
        assert!(kernels.slots.is_empty() && kernels.index.is_empty());
        assert_eq!(kernels.slot_or_insert(name, || Ok(7)).unwrap(), 0);
    }
}
