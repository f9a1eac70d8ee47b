//! Runtime behaviour: no driver is an error value; on a GPU, devices use the primary context,
//! load the module once, and reject launches beyond the device's limits.

mod common;

use std::sync::Arc;

use dlkern::Error;
use dlkern::runtime::{Device, KernelParams, LaunchDims, device_count, driver_available};

#[test]
fn a_missing_driver_is_an_error_value() {
    if driver_available().is_ok() {
        // On a machine with a driver, opening a device that does not exist is the error case.
        let count = device_count().expect("driver present");
        match Device::get(count + 3) {
            Err(Error::NoDevice { ordinal, count: c }) => assert_eq!((ordinal, c), (count + 3, count)),
            other => panic!("expected NoDevice, got {other:?}"),
        }
        return;
    }
    match Device::get(0) {
        Err(Error::NoDriver(message)) => assert!(message.contains("libcuda"), "{message}"),
        other => panic!("expected NoDriver without libcuda, got {other:?}"),
    }
    assert!(matches!(device_count(), Err(Error::NoDriver(_))));
    assert!(matches!(Device::current(), Err(Error::NoDriver(_))));
}

#[test]
#[ignore = "needs a CUDA device"]
fn devices_share_the_primary_context_and_are_opened_once() {
    let a = Device::get(0).unwrap();
    let b = Device::get(0).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert!(a.context().is_primary());
    let (major, minor) = a.compute_capability();
    assert_eq!(dlkern::runtime::ptx::select(major, minor).unwrap().arch, a.module_arch());
    assert_eq!(a.has_wgmma(), (major, minor) == (9, 0), "the sm_90a module runs on Hopper only");
    let current = Device::current().unwrap();
    assert!(Arc::ptr_eq(&a, &current));
    let f1 = a.function("rmsnorm_vec_f16").unwrap();
    let f2 = a.function("rmsnorm_vec_f16").unwrap();
    assert!(Arc::ptr_eq(&f1, &f2), "function handles are cached");
    // A build with a ptxas ships the module as machine code too, which the device loads (no
    // JIT) unless DLKERN_LOAD_PTX asks for the PTX; the driver refusing it falls back to the
    // PTX, which this would catch.
    let with_cubin = !dlkern::runtime::ptx_forced()
        && dlkern::runtime::ptx::select(major, minor).unwrap().cubin_for(major, minor).is_some();
    assert_eq!(a.module_from_cubin(), Some(with_cubin), "module loaded from the cubin where there is one");
    eprintln!("{a:?}: max dynamic shared memory {} bytes", a.max_shared_bytes_per_block());
}

#[test]
#[ignore = "needs a CUDA device"]
fn unknown_kernels_and_oversized_launches_are_errors() {
    let (device, stream) = common::gpu();
    assert!(matches!(device.function("no_such_kernel"), Err(Error::Driver { .. })));
    let too_many_threads = LaunchDims { grid: (1, 1, 1), block: (2048, 1, 1), shared_bytes: 0 };
    let too_much_shared = LaunchDims { grid: (1, 1, 1), block: (32, 1, 1), shared_bytes: 4 << 20 };
    for dims in [too_many_threads, too_much_shared] {
        // SAFETY: the launch is rejected before it reaches the driver (no parameters needed).
        let result = unsafe { device.launch("rmsnorm_vec_f16", dims, stream.cu_stream(), KernelParams::new()) };
        assert!(matches!(result, Err(Error::LaunchLimit { .. })), "{result:?}");
    }
}
