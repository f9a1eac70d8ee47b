// Block shape, flag bits and partition of `probe_stream_read` (kernels-gpu/src/probe/mod.rs), also
// compiled into the host launcher (host/launch/probe.rs): no device code.

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
