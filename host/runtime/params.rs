//! The parameter list of one kernel launch.

use std::ffi::c_void;

/// Words of parameter storage: the longest list today is the Hopper attention kernel's three
/// 128-byte tensor maps, seven pointers and 72-byte `Dims` (64 words).
const WORDS: usize = 72;
/// Parameters per list.
const MAX_PARAMS: usize = 16;

/// A kernel's parameters, copied in the kernel's order (`cuLaunchKernel` reads each one through
/// a pointer): device addresses with [`KernelParams::pointers`], scalars and `#[repr(C)]`
/// structs with [`KernelParams::value`]. Each value gets its own 8-byte-aligned slot on the
/// stack, so building a list allocates nothing and callers keep no mutable locals alive.
///
/// ```ignore
/// let params = KernelParams::new().pointers(&[x, y]).value(cols as u32).value(dims);
/// unsafe { device.launch(kernel, launch_dims, stream, params) }?;
/// ```
pub struct KernelParams {
    words: [u64; WORDS],
    used: usize,
    starts: [usize; MAX_PARAMS],
    count: usize,
    /// Set when a value did not fit; the launch then fails instead of running short.
    overflow: bool,
}

impl Default for KernelParams {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelParams {
    /// An empty list.
    pub fn new() -> Self {
        KernelParams { words: [0; WORDS], used: 0, starts: [0; MAX_PARAMS], count: 0, overflow: false }
    }

    /// Appends one parameter: a copy of `value`'s bytes (a kernel scalar or `#[repr(C)]` struct
    /// whose layout matches the kernel's declaration).
    #[inline(always)]
    pub fn value<T: Copy>(mut self, value: T) -> Self {
        self.push(value);
        self
    }

    /// Appends device addresses, one parameter each.
    #[inline(always)]
    pub fn pointers(mut self, addresses: &[u64]) -> Self {
        for &address in addresses {
            self.push(address);
        }
        self
    }

    /// The builder's step, in place: a list is half a kilobyte, and a chain of by-value steps
    /// that the compiler does not fuse copies it whole at each one (measured: 390 ns to build
    /// the decode attention's thirteen parameters that way, against 60 ns in place).
    #[inline(always)]
    fn push<T: Copy>(&mut self, value: T) {
        const { assert!(align_of::<T>() <= align_of::<u64>()) };
        let words = size_of::<T>().div_ceil(8).max(1);
        if self.count == MAX_PARAMS || self.used + words > WORDS {
            self.overflow = true;
            return;
        }
        // SAFETY: the slot is inside `words` (checked), 8-byte aligned, and T's alignment is at
        // most 8 (asserted); T is Copy, so a bitwise copy is a valid value.
        unsafe { self.words.as_mut_ptr().add(self.used).cast::<T>().write(value) };
        self.starts[self.count] = self.used;
        self.count += 1;
        self.used += words;
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether a value did not fit (the list is then unusable).
    pub(crate) fn overflowed(&self) -> bool {
        self.overflow
    }

    /// The `void**` array `cuLaunchKernel` takes, pointing into `self`.
    pub(crate) fn raw(&mut self) -> [*mut c_void; MAX_PARAMS] {
        let base = self.words.as_mut_ptr();
        // SAFETY: every start is inside `words` (checked when it was pushed).
        std::array::from_fn(|i| {
            if i < self.count { unsafe { base.add(self.starts[i]).cast() } } else { std::ptr::null_mut() }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Dims {
        m: u32,
        n: u32,
        scale: f32,
    }

    #[test]
    fn values_land_in_order_each_in_its_own_aligned_slot() {
        let mut p = KernelParams::new().pointers(&[0x1000, 0x2000]).value(7u32).value(Dims { m: 3, n: 5, scale: 0.5 });
        assert_eq!((p.len(), p.overflowed()), (4, false));
        let raw = p.raw();
        // SAFETY: the slots hold the values pushed, in this order.
        unsafe {
            assert_eq!(*raw[0].cast::<u64>(), 0x1000);
            assert_eq!(*raw[1].cast::<u64>(), 0x2000);
            assert_eq!(*raw[2].cast::<u32>(), 7);
            let d = *raw[3].cast::<Dims>();
            assert_eq!((d.m, d.n, d.scale), (3, 5, 0.5));
        }
        assert!(raw.iter().all(|p| (*p as usize).is_multiple_of(8) || p.is_null()));
        assert!(raw[4..].iter().all(|p| p.is_null()));
    }

    #[test]
    fn too_many_values_overflow_instead_of_truncating() {
        let p = KernelParams::new().pointers(&[1; MAX_PARAMS + 1]);
        assert!(p.overflowed());
        let big = KernelParams::new().value([0u64; WORDS]).value(1u8);
        assert!(big.overflowed());
    }
}
