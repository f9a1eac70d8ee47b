// Block shape, flag bits and partition of `probe_stream_read`, and the entry points of the
// probe modules (kernels-gpu/src/probe/mod.rs), also compiled into the host launchers of the
// tests and benches (tests/common/probe.rs): no device code.

/// Threads per block of `probe_stream_read`.
pub const STREAM_READ_THREADS: u32 = 256;
/// 16-byte loads per thread and step of the loop (ptxas keeps about half of them in flight at
/// once, at 32 registers: with 2048 threads per SM that is still 64 KiB per SM).
pub const STREAM_READ_UNROLL: u32 = 8;

/// The data is constant: every read goes before `griddepcontrol.wait`, so a grid launched as a
/// programmatic dependent reads while the grid before it finishes (as the W4 decode kernels
/// copy their first weights). Without it the wait comes first.
pub const STREAM_READ_BEFORE_WAIT: u32 = 1;
/// Each block lets the next grid start (`griddepcontrol.launch_dependents`) as it starts,
/// instead of at its exit.
pub const STREAM_READ_EARLY_DEPENDENTS: u32 = 2;

/// The 16-byte vectors block `b` of `blocks` reads out of `vectors`: `[b * per, min((b + 1) *
/// per, vectors))` with `per = stream_read_per_block(vectors, blocks)`, a multiple of the
/// threads' loads per step, so that every block but the last runs whole steps.
pub const fn stream_read_per_block(vectors: u32, blocks: u32) -> u32 {
    let step = STREAM_READ_THREADS * STREAM_READ_UNROLL;
    let blocks = if blocks == 0 { 1 } else { blocks };
    vectors.div_ceil(blocks).div_ceil(step) * step
}

/// An entry point of the probe modules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `probe_mma_m16n8k16_f16`: `mma.sync` m16n8k16, f16 inputs, B n-major.
    MmaF16,
    /// `probe_mma_m16n8k16_bf16`: as [`Entry::MmaF16`] for bf16.
    MmaBf16,
    /// `probe_mma_m16n8k16_f16_ktrans`: as [`Entry::MmaF16`], B k-major (`ldmatrix.trans`).
    MmaF16KTrans,
    /// `probe_mma_m16n8k32_s8`: `mma.sync` m16n8k32, int8 inputs.
    MmaS8,
    /// `probe_fast_math_f32`: `ex2.approx`, `rcp.approx`, `rsqrt.approx`.
    FastMath,
    /// `probe_stream_read`: the read-only memory ceiling.
    StreamRead,
    /// `probe_tma_load`: one tensor copy (TMA) through a tensor map passed as a kernel
    /// parameter; the sm_90a module only.
    TmaLoad,
}

impl Entry {
    /// Whether only the arch-specific (sm_90a) probe module has the entry.
    pub const fn arch_specific(self) -> bool {
        matches!(self, Entry::TmaLoad)
    }
}

/// Every entry point of the probe modules, with its symbol.
pub const ENTRIES: &[(Entry, &str)] = &[
    (Entry::MmaF16, "probe_mma_m16n8k16_f16"),
    (Entry::MmaBf16, "probe_mma_m16n8k16_bf16"),
    (Entry::MmaF16KTrans, "probe_mma_m16n8k16_f16_ktrans"),
    (Entry::MmaS8, "probe_mma_m16n8k32_s8"),
    (Entry::FastMath, "probe_fast_math_f32"),
    (Entry::StreamRead, "probe_stream_read"),
    (Entry::TmaLoad, "probe_tma_load"),
];

/// The symbol of `entry`, if the modules have it.
pub fn entry(entry: Entry) -> Option<&'static str> {
    ENTRIES.iter().find(|&&(e, _)| e == entry).map(|&(_, name)| name)
}
