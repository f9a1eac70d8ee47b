//! Shared-memory barrier objects (PTX ISA §9.7.13.15 `mbarrier`, sm_80+; the `try_wait` form
//! sm_90): a 64-bit counter in shared memory whose phase completes once its expected number of
//! arrivals has come. Unlike `bar.sync`, arriving and waiting are separate instructions, so a
//! thread can announce that a resource is ready (or free) early and wait for others' late.

use core::arch::asm;

use super::SharedAddr;

/// `mbarrier.init.shared::cta.b64 [bar], count` (PTX ISA §9.7.13.15.9): a barrier whose phases
/// each complete after `count` arrivals; the current phase has parity 0.
///
/// # Safety
/// `bar` is 8-byte aligned shared memory that no thread uses as a barrier now (a fresh one, or
/// one [`invalidate`]d); other threads may use it only after a barrier that follows this.
#[inline(always)]
pub unsafe fn init(bar: SharedAddr, count: u32) {
    // SAFETY: the caller guarantees an unused, aligned barrier object.
    unsafe { asm!("mbarrier.init.shared::cta.b64 [{}], {};", in(reg32) bar.0, in(reg32) count, options(nostack)) };
}

/// `mbarrier.inval.shared::cta.b64 [bar]` (PTX ISA §9.7.13.15.10): ends `bar`'s life as a
/// barrier, so that its memory may be reused or initialized again.
///
/// # Safety
/// No thread arrives at or waits on `bar` any more (a block barrier after the last use).
#[inline(always)]
pub unsafe fn invalidate(bar: SharedAddr) {
    // SAFETY: the caller guarantees the barrier is quiescent.
    unsafe { asm!("mbarrier.inval.shared::cta.b64 [{}];", in(reg32) bar.0, options(nostack)) };
}

/// `mbarrier.arrive.release.cta.shared::cta.b64` (PTX ISA §9.7.13.15.13): one arrival on the
/// current phase of `bar`; this thread's earlier memory accesses happen before what a thread
/// that waits for the phase ([`wait_parity`]) does after it.
///
/// # Safety
/// `bar` was [`init`]ialized, and its current phase expects an arrival from this thread (more
/// arrivals than its count would complete a later phase early).
#[inline(always)]
pub unsafe fn arrive(bar: SharedAddr) {
    // SAFETY: the caller guarantees an initialized barrier expecting this arrival.
    unsafe {
        asm!(
            "{{ .reg .b64 state; mbarrier.arrive.release.cta.shared::cta.b64 state, [{}]; }}",
            in(reg32) bar.0, options(nostack)
        )
    };
}

/// `mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [bar], bytes` (PTX ISA
/// §9.7.13.15.13): raises the current phase's expected transactions by `bytes` (bulk copies
/// that complete on `bar` count theirs off, [`super::bulk_copy`]), then one arrival. The phase
/// completes once both its arrivals and its bytes are in.
///
/// # Safety
/// As [`arrive`]; the bytes announced are the ones that land on this phase.
#[inline(always)]
pub unsafe fn arrive_expect_tx(bar: SharedAddr, bytes: u32) {
    // SAFETY: the caller guarantees an initialized barrier expecting this arrival and bytes.
    unsafe {
        asm!(
            "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [{}], {};",
            in(reg32) bar.0, in(reg32) bytes, options(nostack)
        )
    };
}

/// `mbarrier.try_wait.parity.acquire.cta.shared::cta.b64` (PTX ISA §9.7.13.15.16), retried
/// until it succeeds: returns once the phase of `bar` with parity `parity` (0 or 1) has
/// completed; what the arriving threads did before their arrivals happens before what this
/// thread does after. (Each try suspends the thread up to a time the hardware chooses, so the
/// loop does not spin hot.)
///
/// # Safety
/// `bar` was [`init`]ialized, and the phase waited for is the current or the one just before
/// it (a parity names two phases apart the same one): the protocol must keep every thread
/// within one phase of the barrier. A phase whose arrivals never come hangs the thread.
#[inline(always)]
pub unsafe fn wait_parity(bar: SharedAddr, parity: u32) {
    loop {
        let done: u32;
        // SAFETY: the caller guarantees an initialized barrier.
        unsafe {
            asm!(
                "{{ .reg .pred p; mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [{b}], {q}; selp.u32 {d}, 1, 0, p; }}",
                b = in(reg32) bar.0, q = in(reg32) parity, d = out(reg32) done, options(nostack)
            )
        };
        if done != 0 {
            return;
        }
    }
}

/// `mbarrier.test_wait.parity.acquire.cta.shared::cta.b64` (PTX ISA §9.7.13.15.16): whether the
/// phase of `bar` with parity `parity` has completed, asked once, without suspending; when it
/// has, what the arriving threads did before their arrivals happens before what this thread
/// does after. For waits that must end even when a phase never completes (device self-tests
/// that report a lost copy instead of hanging).
///
/// # Safety
/// As [`wait_parity`].
#[inline(always)]
pub unsafe fn test_parity(bar: SharedAddr, parity: u32) -> bool {
    let done: u32;
    // SAFETY: the caller guarantees an initialized barrier.
    unsafe {
        asm!(
            "{{ .reg .pred p; mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [{b}], {q}; selp.u32 {d}, 1, 0, p; }}",
            b = in(reg32) bar.0, q = in(reg32) parity, d = out(reg32) done, options(nostack)
        )
    };
    done != 0
}
