/* calloc_patterns read|dense-then-sparse: a 240 MB calloc'd block, freed and asked again 20 times.
 * `read`: every page read after each calloc, none written (the kernel's zero page maps them).
 * `dense-then-sparse`: written whole 4 times, then one byte written every 16 MiB 20 times.
 * Each calloc must read zero where the program looks. Prints "most_rss_mb N": the most resident
 * memory after any of the 20 callocs of the last phase but its first three (glibc, mapping each
 * block afresh: about 1; ours writes zeros over the block while most owners of late wrote theirs,
 * the first two of the sparse phase after four dense ones). Note [calloc costs what is touched]
 * in src/host/host_layer/alloc.rs. */
#include "check.h"
#include <string.h>
#include <unistd.h>

#define SIZE (240u << 20)

static long rss_mb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    CHECK(f && fscanf(f, "%ld %ld", &size, &resident) == 2);
    fclose(f);
    return resident * sysconf(_SC_PAGESIZE) >> 20;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    int read_only = !strcmp(argv[1], "read");
    if (!read_only) {
        for (int i = 0; i < 4; i++) {
            volatile char *p = calloc(1, SIZE);
            CHECK(p);
            memset((char *)p, 0x5a, SIZE);
            __asm__ volatile("" ::: "memory"); /* the fill is not dropped before the free */
            free((char *)p);
        }
    }
    long most = 0;
    for (int i = 0; i < 20; i++) {
        volatile char *p = calloc(1, SIZE);
        CHECK(p);
        long sum = 0;
        for (size_t at = 0; at < SIZE; at += read_only ? 4096 : 16u << 20) {
            sum += p[at];
            if (!read_only) p[at] = 1;
        }
        CHECK(sum == 0);
        if (i > 2 && rss_mb() > most) most = rss_mb();
        free((char *)p);
    }
    printf("most_rss_mb %ld\n", most);
    return 0;
}
