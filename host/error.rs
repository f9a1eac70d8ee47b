//! The crate's one error type. No CUDA driver, no device, an unsupported GPU, bad arguments and
//! failed launches are all values of [`Error`]; nothing in dlkern panics on them.

use cudarc::driver::DriverError;

/// Result with dlkern's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in dlkern.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `libcuda.so` could not be loaded (no NVIDIA driver on this machine).
    #[error("CUDA driver not available: {0}")]
    NoDriver(String),
    /// The driver loaded but there is no device with this ordinal.
    #[error("no CUDA device {ordinal} (this machine has {count})")]
    NoDevice { ordinal: usize, count: usize },
    /// The GPU's compute capability is older than any PTX module dlkern ships.
    #[error("GPU '{name}' has compute capability {major}.{minor}; dlkern needs 8.0 (Ampere) or newer")]
    UnsupportedGpu { name: String, major: i32, minor: i32 },
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {call}: {source}")]
    Driver {
        call: &'static str,
        #[source]
        source: DriverError,
    },
    /// A kernel argument violates the kernel's contract (dtype, shape, stride, alignment,
    /// null pointer, overlap). The message names the kernel and the argument.
    #[error("{kernel}: {message}")]
    InvalidArgument { kernel: &'static str, message: String },
    /// A DLPack tensor is malformed or not what the kernel accepts. The message says which
    /// property and what was expected.
    #[error("tensor '{name}': {message}")]
    InvalidTensor { name: String, message: String },
    /// No kernel is registered under this name.
    #[error("no kernel named '{name}' is registered{}", suggestions_text(.suggestions))]
    UnknownKernel { name: String, suggestions: Vec<String> },
    /// A kernel is already registered under this name (register with `replace` to swap it).
    #[error("a kernel named '{0}' is already registered (pass replace to swap it)")]
    DuplicateKernel(String),
    /// A kernel (built-in or user-registered) reported a failure.
    #[error("kernel '{name}' failed: {message}")]
    KernelFailed { name: String, message: String },
    /// A plug-in library could not be loaded or registered nothing.
    #[error("plug-in '{path}': {message}")]
    Plugin { path: String, message: String },
    /// The launch needs more than the device offers (block size, shared memory).
    #[error("{kernel}: launch exceeds device limits: {message}")]
    LaunchLimit { kernel: &'static str, message: String },
}

fn suggestions_text(suggestions: &[String]) -> String {
    if suggestions.is_empty() { String::new() } else { format!("; did you mean {}?", suggestions.join(", ")) }
}

impl Error {
    /// An [`Error::InvalidArgument`] for `kernel`.
    pub fn invalid(kernel: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument { kernel, message: message.into() }
    }
}

/// Attaches the name of the driver call to a cudarc error.
pub(crate) trait DriverContext<T> {
    fn during(self, call: &'static str) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, DriverError> {
    fn during(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Driver { call, source })
    }
}
