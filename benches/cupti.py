"""GPU time of whatever a piece of Python launches on the device: every kernel of the process
(ORT's and dlkern's alike) as CUPTI records it, through torch.profiler. The host's share is
what the caller's wall time has beyond it."""

import torch


def kernel_times(fn, runs, width=60):
    """Calls `fn` `runs` times under the profiler: (device us per run, {kernel name: us per run})."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    breakdown = {}
    for e in kernels:
        breakdown[e.name[:width]] = breakdown.get(e.name[:width], 0.0) + e.device_time / runs
    return sum(e.device_time for e in kernels) / runs, breakdown
