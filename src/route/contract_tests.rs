//! The C contract of the malloc family, driven through the route in this test process: the
//! process's own host layer (over the kernel's pages, the state the preloaded library runs on)
//! behind it, and the C library's malloc as the next allocator. Alignment, realloc's edge
//! cases, calloc's zeroing and overflow, usable sizes, errno, and foreign pointers, each beside
//! what glibc answers for the same call. The process tests (preload-tests/c/contract.c) run the
//! same contract through the exported symbols.

use super::*;
use super::aligned_calls::*;
use super::realloc::reallocarray;
use crate::sys::process::errno;
use crate::record::holders::Asker;

const MIB: usize = 1 << 20;

/// The smallest request the host layer serves. Init runs on the first call; the tests race to
/// it, and a call made while another thread initialises is answered without us, so each test
/// waits until the state is ready before it begins.
fn large() -> usize {
    let ready = (0..10_000_000).any(|_| {
        std::thread::yield_now();
        ready().is_some()
    });
    assert!(ready, "init resolved the next allocator");
    let from = LARGE_FROM.load(Acquire);
    assert!(from > 0 && from < usize::MAX, "the cache is on in tests");
    from
}

fn is_ours(p: *mut c_void) -> bool {
    matches!(owner(p), Owner::Live { .. })
}

fn fill(p: *mut c_void, len: usize, byte: u8) {
    // SAFETY: p is a live block of at least len bytes, ours to write.
    unsafe { core::ptr::write_bytes(p.cast::<u8>(), byte, len) };
}

fn all(p: *mut c_void, len: usize, byte: u8) -> bool {
    // SAFETY: p is a live block of at least len bytes.
    unsafe { core::slice::from_raw_parts(p.cast::<u8>(), len) }.iter().all(|&b| b == byte)
}

#[test]
fn large_blocks_are_ours_aligned_and_usable_for_what_was_asked() {
    let n = large() + 12345;
    let p = malloc_as(n, Asker::UNKNOWN);
    assert!(!p.is_null() && is_ours(p));
    assert_eq!(p as usize % BLOCK_ALIGN, 0, "our blocks start on BLOCK_ALIGN");
    // SAFETY: p is live.
    let usable = unsafe { usable_size(p) };
    assert!(usable >= n && usable.is_multiple_of(PAGE));
    fill(p, usable, 0xa5);
    // SAFETY: p is live and ours.
    unsafe { free(p) };
    let small = malloc_as(100, Asker::UNKNOWN);
    assert!(!small.is_null() && !is_ours(small), "small requests are the next allocator's");
    // SAFETY: a live pointer of the next allocator.
    assert!(unsafe { usable_size(small) } >= 100);
    // SAFETY: as above.
    unsafe { free(small) };
    // SAFETY: null is no block.
    assert_eq!(unsafe { usable_size(core::ptr::null_mut()) }, 0);
}

#[test]
fn calloc_zeroes_a_reused_block_and_refuses_an_overflowing_count() {
    let n = large() + 3 * PAGE;
    let p = malloc_as(n, Asker::UNKNOWN);
    fill(p, n, 0xff);
    // SAFETY: p is live and ours.
    unsafe { free(p) };
    let q = calloc_as(n / 8, 8, Asker::UNKNOWN);
    assert!(!q.is_null() && all(q, n, 0), "calloc hands out zeros whatever the block held before");
    // SAFETY: q is live.
    unsafe { free(q) };
    set_errno(0);
    assert!(calloc_as(usize::MAX / 2, 3, Asker::UNKNOWN).is_null());
    assert_eq!(errno(), libc::ENOMEM, "count * size overflows: ENOMEM, as glibc");
    let z = calloc_as(0, 0, Asker::UNKNOWN);
    assert!(!z.is_null(), "calloc(0, 0) is a unique pointer, as glibc's");
    // SAFETY: z is live.
    unsafe { free(z) };
}

#[test]
fn realloc_keeps_the_contents_across_every_boundary() {
    let big = large();
    // SAFETY: every pointer passed is null or live, as the C contract requires.
    unsafe {
        let p = realloc_as(core::ptr::null_mut(), 1000, Asker::UNKNOWN);
        assert!(!p.is_null(), "realloc(NULL, n) is malloc(n)");
        fill(p, 1000, 1);
        let p = realloc_as(p, big + MIB, Asker::UNKNOWN);
        assert!(is_ours(p) && all(p, 1000, 1), "small to large: moved into the host layer, contents kept");
        fill(p, big + MIB, 2);
        let p = realloc_as(p, 2 * big + MIB, Asker::UNKNOWN);
        assert!(is_ours(p) && all(p, big + MIB, 2), "large to larger: contents kept");
        let p = realloc_as(p, big + 1, Asker::UNKNOWN);
        assert!(is_ours(p) && all(p, big + 1, 2), "large to smaller large: contents kept");
        let p = realloc_as(p, 500, Asker::UNKNOWN);
        assert!(!p.is_null() && !is_ours(p) && all(p, 500, 2), "large to small: moved to the next allocator, contents kept");
        free(p);
        let q = malloc_as(big, Asker::UNKNOWN);
        set_errno(0);
        assert!(realloc_as(q, 0, Asker::UNKNOWN).is_null(), "realloc(p, 0) frees p and answers NULL, as glibc");
        assert_eq!(errno(), 0, "and sets no errno");
        assert!(!is_ours(q), "the block was freed");
    }
}

#[test]
fn reallocarray_refuses_an_overflow_and_leaves_the_block() {
    let big = large();
    // SAFETY: p is live until the last free.
    unsafe {
        let p = malloc_as(big, Asker::UNKNOWN);
        fill(p, big, 7);
        set_errno(0);
        assert!(reallocarray(p, usize::MAX / 2, 3, Asker::UNKNOWN).is_null());
        assert_eq!(errno(), libc::ENOMEM);
        assert!(is_ours(p) && all(p, big, 7), "a failed reallocarray leaves the block as it was");
        let q = reallocarray(p, big / 4, 8, Asker::UNKNOWN);
        assert!(is_ours(q) && all(q, big, 7));
        free(q);
    }
}

#[test]
fn alignment_rules_are_glibcs() {
    let big = large();
    let mut out = core::ptr::null_mut();
    // SAFETY: out is ours to write; each pointer handed out is freed once.
    unsafe {
        assert_eq!(posix_memalign(&mut out, 24, 64, Asker::UNKNOWN), libc::EINVAL, "not a power of two");
        assert_eq!(posix_memalign(&mut out, 4, 64, Asker::UNKNOWN), libc::EINVAL, "below sizeof(void *)");
        assert_eq!(posix_memalign(core::ptr::null_mut(), 64, 64, Asker::UNKNOWN), libc::EINVAL);
        set_errno(libc::EAGAIN);
        assert_eq!(posix_memalign(&mut out, 2 * MIB, big, Asker::UNKNOWN), 0);
        assert_eq!(errno(), libc::EAGAIN, "posix_memalign leaves errno alone");
        assert!(is_ours(out) && (out as usize).is_multiple_of(2 * MIB));
        free(out);
        assert_eq!(errno(), libc::EAGAIN, "free leaves errno alone, as glibc's since 2.33");
        assert_eq!(posix_memalign(&mut out, 1 << 40, big, Asker::UNKNOWN), libc::ENOMEM, "an alignment no mapping can have");
        assert_eq!(errno(), libc::EAGAIN, "and still no errno of ours");

        let p = memalign(3000, big, Asker::UNKNOWN);
        assert!(!p.is_null() && (p as usize).is_multiple_of(4096), "memalign rounds the alignment up to a power of two");
        free(p);
        set_errno(0);
        assert!(memalign(usize::MAX, 64, Asker::UNKNOWN).is_null());
        assert_eq!(errno(), libc::EINVAL, "an alignment too large to round");
        let v = valloc(big + 1, Asker::UNKNOWN);
        assert!(is_ours(v) && (v as usize).is_multiple_of(PAGE));
        free(v);
        let z = pvalloc(0, Asker::UNKNOWN);
        assert!(!z.is_null() && (z as usize).is_multiple_of(PAGE) && usable_size(z) >= PAGE, "pvalloc(0) is one page");
        free(z);
        set_errno(0);
        assert!(pvalloc(usize::MAX - 10, Asker::UNKNOWN).is_null());
        assert_eq!(errno(), libc::ENOMEM, "a size that cannot be rounded to pages");
    }
}

#[test]
fn foreign_pointers_go_to_the_next_allocator_whatever_their_alignment() {
    let g = ready().expect("init");
    // SAFETY: the next allocator's own blocks, freed once each through the route.
    unsafe {
        // On BLOCK_ALIGN, where a block of ours could start: the registry, not the address, decides.
        let p = g.next.alloc_aligned(BLOCK_ALIGN, 100);
        assert!(!p.is_null() && !plainly_foreign(p) && !is_ours(p));
        assert!(usable_size(p) >= 100);
        let q = realloc_as(p, 200, Asker::UNKNOWN);
        assert!(!q.is_null() && !is_ours(q));
        free(q);
        free(core::ptr::null_mut());
    }
}
