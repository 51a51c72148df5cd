/* A cached piece between two live blocks of one mapping is unmapped while the program has used up
 * vm.max_map_count with mappings of its own: the kernel refuses the split (ENOMEM). Its pages
 * must still leave RSS, and the range must go once the program gives mappings back (Note
 * [Unmaps the kernel refused] in src/sys/unmap_later.rs); under glibc alone every block was its
 * own mapping, unmapped at free. */
#include "check.h"
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

static int mapped(uintptr_t a) {
    FILE *f = fopen("/proc/self/maps", "r");
    CHECK(f != NULL);
    char line[512];
    int hit = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) hit = 1;
    }
    fclose(f);
    return hit;
}

int main(void) {
    long start_kb = status_kb("RssAnon");
    /* A 32 MiB block written and freed; three 4 MiB requests are cut from it, so that they
     * share its mapping; the middle one is freed: a cached piece between two live blocks. */
    char *big = malloc(32 * MB);
    CHECK(big != NULL);
    memset(big, 1, 32 * MB);
    free(big);
    char *live = malloc(4 * MB), *mid = malloc(4 * MB), *live2 = malloc(4 * MB);
    CHECK(live && mid && live2);
    memset(live, 2, 4 * MB);
    memset(mid, 3, 4 * MB);
    memset(live2, 4, 4 * MB);
    tm_stats_t s;
    if (tm_stats(&s) == 0 && s.enabled) /* cut from one mapping, one after the other */
        CHECK(mid == live + 4 * MB && live2 == mid + 4 * MB);
    uintptr_t piece = (uintptr_t)mid;
    free(mid);
    long base_kb = status_kb("RssAnon");
    /* Use up the count: a reservation with every other page readable, then single pages. */
    size_t pg = 4096, pages = 1 << 17;
    char *res = mmap(NULL, pages * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(res != MAP_FAILED);
    for (size_t i = 1; i + 1 < pages; i += 2)
        if (mprotect(res + i * pg, pg, PROT_READ)) break;
    while (mmap(NULL, pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED &&
           mmap(NULL, pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
    }
    malloc_trim(0); /* the cached piece leaves: its unmap would split the mapping */
    long trimmed_kb = status_kb("RssAnon");
    printf("RssAnon %ld kB before the trim, %ld kB after\n", base_kb, trimmed_kb);
    /* Only the two live blocks stay resident (within 1 MiB): the piece's pages left too, though
     * its range may have to wait. */
    CHECK(trimmed_kb <= start_kb + 9 * 1024);
    munmap(res, pages * pg); /* the program gives its mappings back */
    CHECK(live[12345] == 2 && live2[12345] == 4);
    free(live);
    free(live2);
    malloc_trim(0);
    int left = mapped(piece);
    printf("the piece is %s\n", left ? "still mapped" : "unmapped");
    CHECK(!left);
    puts("map count ok");
    return 0;
}
