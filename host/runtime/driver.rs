//! Loading the CUDA driver library at run time, as an error value when it is absent.

use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Whether `libcuda` can be loaded; the answer is cached. Everything in [`super`] checks this
/// before its first driver call, because cudarc's lazy loader panics when the library is absent.
pub fn driver_available() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the library by its usual names.
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(Error::NoDriver("libcuda.so could not be loaded (no NVIDIA driver installed?)".into()))
    }
}

/// Runs a driver-touching closure, turning a panic inside cudarc (a driver too old to export a
/// symbol, for instance) into an error, so that no panic escapes dlkern's entry points.
pub(crate) fn guarded<T>(what: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    driver_available()?;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(Error::NoDriver(format!("{what}: the CUDA driver could not be used: {detail}")))
        }
    }
}
