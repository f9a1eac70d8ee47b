//! Compile-time unrolling.

/// Expands `$body` once per listed index with `$u` bound to it as a constant, so arrays indexed
/// by `$u` stay in registers: LLVM does not always fully unroll loops with large bodies, and an
/// array indexed by a loop variable then goes to local memory.
///
/// ```ignore
/// unroll!(U in [0, 1, 2, 3] { acc[U] += x[U]; });
/// ```
#[macro_export]
macro_rules! unroll {
    ($u:ident in [$($n:literal),+ $(,)?] $body:block) => {
        $({
            #[allow(non_upper_case_globals)]
            const $u: usize = $n;
            $body
        })+
    };
}
