//! Shared GPU bench plumbing: the device and a stream, CUDA-event timing for criterion's
//! `iter_custom`, and the metadata side file the report generator reads.
//!
//! Every bench times the GPU with events recorded on the bench stream around `iters`
//! back-to-back launches (so launch gaps are amortised, as in a model), after criterion's
//! warm-up. Each family writes, next to criterion's own output, one JSON line per benchmark
//! with what criterion does not know: the bytes and FLOPs counted, the extra device memory the
//! kernel uses, and which implementation it is.
#![allow(dead_code)]

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUevent_flags;
use dlkern::runtime::Device;

pub struct Gpu {
    pub device: Arc<Device>,
    pub stream: Arc<CudaStream>,
}

/// The GPU, or `None` (with a message) when there is none, so `cargo bench` on a CPU machine
/// reports that instead of failing.
pub fn gpu() -> Option<Gpu> {
    match Device::get(0) {
        Ok(device) => {
            let stream = device.context().new_stream().expect("create bench stream");
            Some(Gpu { device, stream })
        }
        Err(e) => {
            eprintln!("skipping GPU benches: {e}");
            None
        }
    }
}

impl Gpu {
    /// How many copies of a working set of `bytes` to rotate through so that repeated launches
    /// read from device memory, not from L2 (at least 4x the L2 in all, at most 64 copies).
    pub fn rotation(&self, bytes: u64) -> usize {
        let l2 = self
            .device
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .unwrap_or(64 << 20)
            .max(1) as u64;
        (4 * l2).div_ceil(bytes.max(1)).clamp(1, 64) as usize
    }

    /// Runs `launch` `iters` times on the bench stream and returns the GPU time between events
    /// recorded before and after.
    pub fn time(&self, iters: u64, mut launch: impl FnMut()) -> Duration {
        let ctx = self.device.context();
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).expect("event");
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).expect("event");
        start.record(&self.stream).expect("record");
        for _ in 0..iters {
            launch();
        }
        end.record(&self.stream).expect("record");
        end.synchronize().expect("synchronize");
        let ms = start.elapsed_ms(&end).expect("elapsed");
        Duration::from_secs_f64(ms as f64 * 1e-3)
    }
}

/// One line of bench metadata (JSON) for the report generator.
pub struct Meta<'a> {
    pub family: &'a str,
    /// criterion's `group/function/parameter` id.
    pub id: String,
    /// `dlkern` or the baseline's name.
    pub implementation: &'a str,
    pub shape: String,
    pub dtype: &'a str,
    /// Bytes the operation must move through device memory (each input read once, each output
    /// written once).
    pub bytes: u64,
    pub flops: u64,
    /// Device memory the implementation needs beyond inputs and outputs.
    pub workspace_bytes: u64,
}

/// Appends `meta` to `$DLKERN_BENCH_META` (default `target/bench-meta.jsonl`).
pub fn record(meta: &Meta) {
    let path = std::env::var("DLKERN_BENCH_META").unwrap_or_else(|_| "target/bench-meta.jsonl".into());
    let line = format!(
        "{{\"family\":\"{}\",\"id\":\"{}\",\"implementation\":\"{}\",\"shape\":\"{}\",\"dtype\":\"{}\",\"bytes\":{},\"flops\":{},\"workspace_bytes\":{}}}\n",
        meta.family, meta.id, meta.implementation, meta.shape, meta.dtype, meta.bytes, meta.flops, meta.workspace_bytes
    );
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&path) {
        let _ = f.write_all(line.as_bytes());
    }
}
