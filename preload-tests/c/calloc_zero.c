/* calloc reads zero on every path of the host cache: a fresh block, a hit on a block written
 * all over (zeros written), a hit on a block touched in two pages (pages dropped), a hit on a
 * released (MADV_FREE'd) block, a split block and its tail, a grown block, and a block that
 * the program has mlock'ed (madvise refuses: zeros written). Every byte is checked. Works with
 * and without the library (the path counts are checked only when it is loaded). */
#include <sys/mman.h>
#include "check.h"

static void all_zero(const unsigned char *p, size_t n, const char *what) {
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < n / 8; i++)
        if (w[i]) {
            fprintf(stderr, "%s: byte %zu of %zu is not zero\n", what, i * 8, n);
            exit(1);
        }
    for (size_t i = n / 8 * 8; i < n; i++) CHECK(p[i] == 0);
}

static unsigned char *zeroed(size_t n, const char *what) {
    unsigned char *p = calloc(1, n);
    CHECK(p);
    all_zero(p, n, what);
    return p;
}

static int is_lazyfree(uintptr_t a) { return smaps_kb(a, "LazyFree") > 0; }

int main(void) {
    tm_stats_t s0, s1;
    int ours = tm_stats(&s0) == 0 && s0.enabled;

    /* Fresh, then a hit on a block written all over. */
    unsigned char *p = zeroed(64 * MB, "fresh");
    memset(p, 0xab, 64 * MB);
    free(p);
    p = zeroed(64 * MB - 100, "hit on a written block");
    /* Touched in two pages: the hit drops the pages instead of writing zeros. (A fresh block:
     * p is still live.) */
    unsigned char *q = malloc(96 * MB);
    CHECK(q);
    free(p);
    q[0] = 1;
    q[50 * MB] = 2;
    free(q);
    q = zeroed(96 * MB, "hit on a sparsely touched block");
    q[4096] = 3;
    q[96 * MB - 1] = 4;
    free(q);
    q = zeroed(96 * MB, "hit on a block zeroed by dropping pages");
    memset(q, 0xcd, 96 * MB);
    free(q);

    /* Split: a small calloc from the big written block, then its tail. */
    unsigned char *head = zeroed(8 * MB, "split head");
    unsigned char *tail = zeroed(80 * MB, "split tail");
    memset(head, 0xef, 8 * MB);
    memset(tail, 0xef, 80 * MB);
    free(tail);
    /* Grown: nothing cached is big enough, the largest smaller block is grown. */
    free(head);
    unsigned char *grown = zeroed(200 * MB, "grown");
    memset(grown, 0x11, 200 * MB);

    /* Locked pages: madvise(MADV_DONTNEED) refuses them; zeros are written instead. */
    unsigned char *locked = malloc(16 * MB);
    CHECK(locked);
    if (mlock(locked, 16 * MB) == 0) {
        locked[0] = 9;
        free(locked);
        locked = zeroed(16 * MB, "hit on a locked block");
        munlock(locked, 16 * MB);
    }
    free(locked);

    /* Released: idle past the release delay (the test sets it short), MADV_FREE'd. */
    free(grown);
    if (ours) {
        wait_until(is_lazyfree, (uintptr_t)grown, "the idle block to show as LazyFree");
        p = zeroed(200 * MB, "hit on a released block");
        free(p);
        CHECK(tm_stats(&s1) == 0);
        CHECK(s1.host_hits - s0.host_hits >= 6);
        CHECK(s1.host_grows - s0.host_grows >= 1);
        CHECK(s1.host_released_blocks - s0.host_released_blocks >= 1);
    }
    puts("calloc ok");
    return 0;
}
