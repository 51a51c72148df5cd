/* An idle cached block is released with MADV_FREE (LazyFree in smaps) within the release delay,
 * with no further allocation call, and unmapped after the expiry delay. Waits on conditions
 * (bounded), never on fixed sleeps. */
#include "check.h"
#include <unistd.h>
#include <time.h>

/* LazyFree kB of the mapping containing addr, or -1 when addr is not mapped. */
static long lazyfree_kb(uintptr_t addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    CHECK(f);
    char line[512];
    int in = 0;
    long found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = addr >= lo && addr < hi;
            if (in) found = 0;
            continue;
        }
        long kb;
        if (in && sscanf(line, "LazyFree: %ld kB", &kb) == 1) found = kb;
    }
    fclose(f);
    return found;
}

static void wait_until(int (*cond)(uintptr_t), uintptr_t addr, const char *what) {
    for (int i = 0; i < 2000; i++) { /* up to 20 s */
        if (cond(addr)) return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "timed out waiting for: %s\n", what);
    exit(1);
}

static int is_lazyfree(uintptr_t a) { return lazyfree_kb(a) >= 60 * 1024; }
static int is_unmapped(uintptr_t a) { return lazyfree_kb(a) == -1; }

int main(void) {
    size_t n = 64 * MB;
    unsigned char *p = malloc(n);
    CHECK(p);
    memset(p, 1, n);
    uintptr_t a = (uintptr_t)p;
    CHECK(lazyfree_kb(a) == 0);
    free(p);
    CHECK(lazyfree_kb(a) >= 0); /* cached, still mapped */
    wait_until(is_lazyfree, a, "the idle block to show as LazyFree");
    tm_stats_t s;
    CHECK(tm_stats(&s) == 0 && s.host_released_blocks >= 1);
    wait_until(is_unmapped, a, "the idle block to be unmapped");
    CHECK(tm_stats(&s) == 0 && s.host_cached_bytes == 0);
    puts("idle ok");
    return 0;
}
