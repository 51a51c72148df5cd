/* An idle cached block is released with MADV_FREE (LazyFree in smaps) within the release delay,
 * with no further allocation call, and unmapped after the expiry delay. Waits on conditions
 * (bounded), never on fixed sleeps. */
#include "check.h"

static int is_lazyfree(uintptr_t a) { return smaps_kb(a, "LazyFree") >= 60 * 1024; }
static int is_unmapped(uintptr_t a) { return smaps_kb(a, "LazyFree") == -1; }
static int counted_released(uintptr_t unused) {
    (void)unused;
    tm_stats_t s;
    return tm_stats(&s) == 0 && s.host_released_blocks >= 1;
}

int main(void) {
    size_t n = 64 * MB;
    unsigned char *p = malloc(n);
    CHECK(p);
    memset(p, 1, n);
    uintptr_t a = (uintptr_t)p;
    CHECK(smaps_kb(a, "LazyFree") == 0);
    free(p);
    CHECK(smaps_kb(a, "LazyFree") >= 0); /* cached, still mapped */
    wait_until(is_lazyfree, a, "the idle block to show as LazyFree");
    /* Counted once madvise has returned: the pages may show LazyFree a moment before. */
    wait_until(counted_released, 0, "the release to be counted");
    tm_stats_t s;
    wait_until(is_unmapped, a, "the idle block to be unmapped");
    CHECK(tm_stats(&s) == 0 && s.host_cached_bytes == 0);
    puts("idle ok");
    return 0;
}
