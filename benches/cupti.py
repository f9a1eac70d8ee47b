"""GPU time of whatever a piece of Python launches on the device: every kernel of the process
(ORT's and dlkern's alike) as CUPTI records it, through torch.profiler. The host's share is
what the caller's wall time has beyond it."""


def busy_time(intervals):
    """The length of the union of (start, end) intervals: the time at least one of them runs.
    Kernels launched as programmatic dependents start before the kernel ahead of them ends and
    wait inside, so their summed durations count the overlap twice; the union does not."""
    busy, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            busy += end - start
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    return busy


def kernel_profile(fn, runs, width=60):
    """Calls `fn` `runs` times under the profiler: {"sum_us": summed kernel durations per run,
    "busy_us": the time per run at least one kernel runs, "kernels": {name: us per run}}."""
    import torch  # the GPU host's; `busy_time` stays importable without it

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    breakdown = {}
    for e in kernels:
        breakdown[e.name[:width]] = breakdown.get(e.name[:width], 0.0) + e.device_time / runs
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    return {
        "sum_us": sum(e.device_time for e in kernels) / runs,
        "busy_us": busy_time(intervals) / runs,
        "kernels": breakdown,
    }


def kernel_times(fn, runs, width=60):
    """Calls `fn` `runs` times under the profiler: (device us per run, {kernel name: us per run})."""
    profile = kernel_profile(fn, runs, width)
    return profile["sum_us"], profile["kernels"]
