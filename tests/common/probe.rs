//! Launchers for the device self-test kernels (`kernels-gpu/src/probe/`), for the tests and
//! benches alone: `tests/probe.rs` and `benches/ceilings.rs` include this file by `#[path]`.
//!
//! Each probe runs one device-module primitive (`cp.async` + `ldmatrix` + `mma.sync`, or the
//! fast-math instructions) on host-provided data, so the test suite can pin down fragment
//! layouts and accuracy on a real GPU against exact references (in `tests/probe.rs`) before larger kernels rely
//! on them. [`stream_read`] is the read-only memory ceiling the benches compare the W4 decode
//! kernels with: a kernel that only reads its bytes, launched as those kernels are.
//!
//! The probes are not in the PTX modules of the library: `build.rs` builds them into modules of
//! their own (the kernel crate with its feature `probes`), which [`Probes::new`] loads.
#![allow(dead_code)]

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use dlkern::ops::common::checks::{check_same_device, check_slice};
use dlkern::runtime::{Device, KernelParams, LaunchDims};
use dlkern::{Error, Result};

const KERNEL: &str = "probe";

/// The probes' launch layout and entry points: the device crate's own source, compiled here too.
#[path = "../../kernels-gpu/src/probe/layout.rs"]
pub mod layout;
use layout::{Entry, STREAM_READ_BEFORE_WAIT, STREAM_READ_EARLY_DEPENDENTS};
pub use layout::{STREAM_READ_THREADS, stream_read_per_block};

// Defines `PTX_MODULES: &[(u32, bool, &str, &[u8])]`: the probe modules, as build.rs built them.
include!(concat!(env!("OUT_DIR"), "/dlkern_kernels_gpu_probe_ptx.rs"));

/// A device with the probe kernels: the probe module for the target of its own module, loaded
/// on the first launch.
pub struct Probes {
    device: Device,
}

impl Probes {
    /// `device` with the probe module for its target ([`Device::with_module`]).
    pub fn new(device: &Device) -> Result<Self> {
        Ok(Probes { device: device.with_module(PTX_MODULES)? })
    }

    /// The device, which launches the probes.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Launches `entry` on `stream`.
    ///
    /// # Safety
    /// As [`Device::launch`]; with `overlap`, as [`Device::launch_overlapping`].
    unsafe fn launch(
        &self,
        entry: Entry,
        dims: LaunchDims,
        stream: &CudaStream,
        args: KernelParams,
        overlap: bool,
    ) -> Result<()> {
        let name = symbol(entry)?;
        // The buffers were checked against the probes' device: the stream must be on it too.
        check_same_device(name, &self.device, stream)?;
        // SAFETY: forwarded contract.
        unsafe {
            if overlap {
                self.device.launch_overlapping(name, dims, stream.cu_stream(), args)
            } else {
                self.device.launch(name, dims, stream.cu_stream(), args)
            }
        }
    }
}

/// The symbol of `entry`.
fn symbol(entry: Entry) -> Result<&'static str> {
    layout::entry(entry).ok_or_else(|| Error::invalid(KERNEL, format!("no probe {entry:?}")))
}

/// Which tensor-core probe to run; tiles are independent 16x8 products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaProbe {
    /// `m16n8k16` f16: A `[16][16]` row-major, B `[8][16]` (n-major), C `[16][8]` f32.
    F16,
    /// `m16n8k16` bf16, layouts as [`MmaProbe::F16`].
    Bf16,
    /// `m16n8k16` f16 with B `[16][8]` (k-major) loaded by `ldmatrix.trans`.
    F16KMajorB,
    /// `m16n8k32` s8: A `[16][32]`, B `[8][32]` (n-major), C `[16][8]` i32.
    S8,
}

impl MmaProbe {
    fn entry(self) -> Entry {
        match self {
            MmaProbe::F16 => Entry::MmaF16,
            MmaProbe::Bf16 => Entry::MmaBf16,
            MmaProbe::F16KMajorB => Entry::MmaF16KTrans,
            MmaProbe::S8 => Entry::MmaS8,
        }
    }

    /// Elements of A, B (input element type) and C per tile.
    pub fn tile_elements(self) -> (usize, usize, usize) {
        match self {
            MmaProbe::S8 => (16 * 32, 8 * 32, 16 * 8),
            _ => (16 * 16, 16 * 8, 16 * 8),
        }
    }

    fn input_bytes(self) -> usize {
        if self == MmaProbe::S8 { 1 } else { 2 }
    }
}

/// Runs `probe` on `tiles` tiles. `A`/`B` are the input element types (2 bytes for the 16-bit
/// probes, 1 for s8), `C` is f32 or i32 (4 bytes).
pub fn mma<A: DeviceRepr, B: DeviceRepr, C: DeviceRepr>(
    probes: &Probes,
    stream: &CudaStream,
    probe: MmaProbe,
    a: &CudaSlice<A>,
    b: &CudaSlice<B>,
    c: &mut CudaSlice<C>,
    tiles: usize,
) -> Result<()> {
    if size_of::<A>() != probe.input_bytes() || size_of::<B>() != probe.input_bytes() || size_of::<C>() != 4 {
        return Err(Error::invalid(
            KERNEL,
            format!("{probe:?} needs {}-byte inputs and 4-byte outputs", probe.input_bytes()),
        ));
    }
    if tiles == 0 || tiles > i32::MAX as usize {
        return Err(Error::invalid(KERNEL, format!("tiles = {tiles} out of range")));
    }
    let (a_elems, b_elems, c_elems) = probe.tile_elements();
    check_slice(KERNEL, "a", &probes.device, a, a_elems * tiles)?;
    check_slice(KERNEL, "b", &probes.device, b, b_elems * tiles)?;
    check_slice(KERNEL, "c", &probes.device, c, c_elems * tiles)?;
    let (a_ptr, _a_sync) = a.device_ptr(stream);
    let (b_ptr, _b_sync) = b.device_ptr(stream);
    let (c_ptr, _c_sync) = c.device_ptr_mut(stream);
    // cudarc allocations are 256-byte aligned, as the probes' 16-byte copies need.
    let args = KernelParams::new().pointers(&[a_ptr, b_ptr, c_ptr]);
    let dims = LaunchDims { grid: (tiles as u32, 1, 1), block: (32, 1, 1), shared_bytes: 0 };
    // SAFETY: three pointer parameters as the kernel declares, sized by check_slice.
    unsafe { probes.launch(probe.entry(), dims, stream, args, false) }
}

/// Runs `ex2.approx`, `rcp.approx` and `rsqrt.approx` on every element of `x`.
pub fn fast_math(
    probes: &Probes,
    stream: &CudaStream,
    x: &CudaSlice<f32>,
    exp2: &mut CudaSlice<f32>,
    recip: &mut CudaSlice<f32>,
    rsqrt: &mut CudaSlice<f32>,
) -> Result<()> {
    let n = x.len();
    if n == 0 {
        return Ok(());
    }
    if n > u32::MAX as usize {
        return Err(Error::invalid(KERNEL, "more than u32::MAX elements"));
    }
    for (name, out) in [("x", x), ("exp2", &*exp2), ("recip", &*recip), ("rsqrt", &*rsqrt)] {
        check_slice(KERNEL, name, &probes.device, out, n)?;
    }
    let (x_ptr, _x) = x.device_ptr(stream);
    let (e_ptr, _e) = exp2.device_ptr_mut(stream);
    let (r_ptr, _r) = recip.device_ptr_mut(stream);
    let (s_ptr, _s) = rsqrt.device_ptr_mut(stream);
    let args = KernelParams::new().pointers(&[x_ptr, e_ptr, r_ptr, s_ptr]).value(n as u32);
    let dims = LaunchDims { grid: ((n as u32).div_ceil(256), 1, 1), block: (256, 1, 1), shared_bytes: 0 };
    // SAFETY: parameters as the kernel declares, every array holds n elements.
    unsafe { probes.launch(Entry::FastMath, dims, stream, args, false) }
}

/// How [`stream_read`] follows the kernel before it on the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamReadOrder {
    /// A plain launch: it starts once the kernel before it has completed.
    Serialized,
    /// A programmatic dependent launch (Hopper, else plain): its blocks may start while the
    /// kernel before it finishes and wait for it before they read. With `early_dependents`
    /// each block lets the next such launch start as it starts, not as it exits.
    Overlapped { early_dependents: bool },
}

/// A validated [`stream_read`] launch: `blocks` blocks of `per_block` 16-byte vectors, one
/// output word per warp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamReadPlan {
    pub vectors: u32,
    pub blocks: u32,
    pub per_block: u32,
    pub out_words: usize,
}

impl StreamReadPlan {
    /// The launch reading `bytes` (a nonzero multiple of 16, at most 2^35) in `blocks` blocks (at
    /// most 2^16).
    pub fn new(bytes: usize, blocks: u32) -> Result<Self> {
        if bytes == 0 || !bytes.is_multiple_of(16) || bytes > 1 << 35 {
            return Err(Error::invalid(KERNEL, format!("{bytes} bytes: need a nonzero multiple of 16, at most 2^35")));
        }
        // So that `blocks * per_block`, at most the vectors plus a step per block, stays below
        // 2^32 (the kernel's block offsets are 32-bit).
        if blocks == 0 || blocks > 1 << 16 {
            return Err(Error::invalid(KERNEL, format!("{blocks} blocks: need 1 to 2^16")));
        }
        let vectors = (bytes / 16) as u32;
        let per_block = stream_read_per_block(vectors, blocks);
        Ok(Self { vectors, blocks, per_block, out_words: (blocks * (STREAM_READ_THREADS / 32)) as usize })
    }
}

/// The launch shape of `blocks` blocks of [`stream_read`].
fn stream_read_dims(blocks: u32) -> LaunchDims {
    LaunchDims { grid: (blocks, 1, 1), block: (STREAM_READ_THREADS, 1, 1), shared_bytes: 0 }
}

/// One wave of [`stream_read`] blocks on the device: its SMs times the blocks one SM holds.
pub fn stream_read_wave(probes: &Probes) -> Result<u32> {
    let device = &probes.device;
    Ok(device.multiprocessors() * device.resident_blocks_per_sm(symbol(Entry::StreamRead)?, &stream_read_dims(1))?)
}

/// Reads all of `src` on the GPU and leaves in `out` (at least `plan.out_words` words) words
/// whose XOR is that of `src`'s 32-bit words (`xor_words` in `tests/probe.rs`).
pub fn stream_read(
    probes: &Probes,
    stream: &CudaStream,
    src: &CudaSlice<u8>,
    out: &mut CudaSlice<u32>,
    blocks: u32,
    order: StreamReadOrder,
) -> Result<()> {
    let (overlap, flags) = match order {
        StreamReadOrder::Serialized => (false, 0),
        StreamReadOrder::Overlapped { early_dependents } => {
            (true, if early_dependents { STREAM_READ_EARLY_DEPENDENTS } else { 0 })
        }
    };
    // SAFETY: without STREAM_READ_BEFORE_WAIT the kernel waits for the kernel before it
    // before it reads `src` or writes `out`.
    unsafe { launch_stream_read(probes, stream, src, out, blocks, overlap, flags) }
}

/// [`stream_read`] as a programmatic dependent whose blocks read all of `src` before they
/// wait for the kernel before it (and write `out` after): how the W4 decode kernels treat
/// their first weights, here for all bytes, which makes it the ceiling for a chain of such
/// launches.
///
/// # Safety
/// No kernel still running on `stream` when this one starts writes `src`.
pub unsafe fn stream_read_constant(
    probes: &Probes,
    stream: &CudaStream,
    src: &CudaSlice<u8>,
    out: &mut CudaSlice<u32>,
    blocks: u32,
    early_dependents: bool,
) -> Result<()> {
    let flags = STREAM_READ_BEFORE_WAIT | if early_dependents { STREAM_READ_EARLY_DEPENDENTS } else { 0 };
    // SAFETY: the caller's contract covers the reads before the wait; `out` is written after it.
    unsafe { launch_stream_read(probes, stream, src, out, blocks, true, flags) }
}

/// # Safety
/// With `STREAM_READ_BEFORE_WAIT` in `flags`, as [`stream_read_constant`].
unsafe fn launch_stream_read(
    probes: &Probes,
    stream: &CudaStream,
    src: &CudaSlice<u8>,
    out: &mut CudaSlice<u32>,
    blocks: u32,
    overlap: bool,
    flags: u32,
) -> Result<()> {
    let plan = StreamReadPlan::new(src.len(), blocks)?;
    check_slice(KERNEL, "src", &probes.device, src, src.len())?;
    check_slice(KERNEL, "out", &probes.device, out, plan.out_words)?;
    let (src_ptr, _src) = src.device_ptr(stream);
    let (out_ptr, _out) = out.device_ptr_mut(stream);
    // cudarc allocations are 256-byte aligned: the 16-byte loads need 16.
    let args = KernelParams::new()
        .pointers(&[src_ptr])
        .value(plan.vectors)
        .value(plan.per_block)
        .pointers(&[out_ptr])
        .value(flags);
    // SAFETY: parameters as the kernel declares, `src` and `out` sized by the plan; the
    // overlapped launch waits before it writes, and before it reads unless the caller's
    // contract (STREAM_READ_BEFORE_WAIT) says the kernel before does not write `src`.
    unsafe { probes.launch(Entry::StreamRead, stream_read_dims(plan.blocks), stream, args, overlap) }
}

/// What [`tma_load`] saw: the box as shared memory held it (swizzled as the map says), and
/// how many times the kernel polled its barrier before the copy landed.
#[derive(Debug)]
pub struct TmaLoaded {
    pub bytes: Vec<u8>,
    pub polls: u32,
}

/// Copies the box of `map` at `coords` (innermost first; 2 or 3 of them, the map's rank) into
/// shared memory with one TMA copy and reads it back. `box_bytes` is the map's box size. `None`
/// if the copy did not land within the kernel's bounded wait (a lost copy, reported instead
/// of hanging the test). The memory the map describes must stay allocated until this returns.
pub fn tma_load(
    probes: &Probes,
    stream: &std::sync::Arc<CudaStream>,
    map: &dlkern::runtime::tensor_map::TensorMap,
    coords: &[i32],
    box_bytes: usize,
) -> Result<Option<TmaLoaded>> {
    if !(2..=3).contains(&coords.len()) {
        return Err(Error::invalid(
            KERNEL,
            format!("{} coordinates: the probe copies boxes of rank 2 or 3", coords.len()),
        ));
    }
    if box_bytes == 0 || !box_bytes.is_multiple_of(16) || box_bytes > 32 << 10 {
        return Err(Error::invalid(
            KERNEL,
            format!("box of {box_bytes} bytes: need a nonzero multiple of 16, at most 32 KiB"),
        ));
    }
    let mut out = stream.alloc_zeros::<u8>(box_bytes + 16).map_err(|e| Error::invalid(KERNEL, e.to_string()))?;
    {
        let (out_ptr, _out) = out.device_ptr_mut(stream);
        let c = |i: usize| coords.get(i).copied().unwrap_or(0);
        let args = KernelParams::new()
            .value(map.words())
            .pointers(&[out_ptr])
            .value(c(0))
            .value(c(1))
            .value(c(2))
            .value(coords.len() as u32)
            .value(box_bytes as u32);
        let dims = LaunchDims { grid: (1, 1, 1), block: (128, 1, 1), shared_bytes: (box_bytes + 1024 + 8) as u32 };
        // SAFETY: the parameters as the kernel declares (the map first, by value); `out` holds
        // the box and the status vector; shared memory as the contract sizes it.
        unsafe { probes.launch(Entry::TmaLoad, dims, stream, args, false) }?;
    }
    let host: Vec<u8> = stream.clone_dtoh(&out).map_err(|e| Error::invalid(KERNEL, e.to_string()))?;
    let word = |i: usize| u32::from_le_bytes(host[box_bytes + 4 * i..box_bytes + 4 * i + 4].try_into().unwrap());
    Ok((word(0) == 1).then(|| TmaLoaded { bytes: host[..box_bytes].to_vec(), polls: word(1) }))
}
