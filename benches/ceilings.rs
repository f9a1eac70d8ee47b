//! The machine's measured ceilings, in the same run as the kernel benches: device-to-device copy
//! bandwidth (bytes read + written per second), the bar for every memory-bound kernel.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn copy_bandwidth(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    let mut group = c.benchmark_group("ceilings");
    for mib in [256usize, 1024] {
        let n = mib << 20;
        let src = gpu.stream.alloc_zeros::<u8>(n).expect("alloc");
        let mut dst = gpu.stream.alloc_zeros::<u8>(n).expect("alloc");
        let id = format!("copy_d2d/{mib}MiB");
        let moved = 2 * n as u64; // read + write
        group.throughput(Throughput::Bytes(moved));
        common::record(&common::Meta {
            family: "ceilings",
            id: format!("ceilings/{id}"),
            implementation: "cuMemcpyDtoDAsync",
            shape: format!("{mib} MiB"),
            dtype: "u8",
            bytes: moved,
            flops: 0,
            workspace_bytes: 0,
        });
        group.bench_function(&id, |b| {
            b.iter_custom(|iters| gpu.time(iters, || gpu.stream.memcpy_dtod(&src, &mut dst).expect("copy")))
        });
    }
    group.finish();
}

criterion_group!(benches, copy_bandwidth);
criterion_main!(benches);
