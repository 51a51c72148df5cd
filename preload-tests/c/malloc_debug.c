/* glibc's malloc debugging library beside us (Note [Memory debuggers] in src/state.rs): large
 * and small blocks by every allocation name, malloc_usable_size, reallocarray, realloc across
 * the threshold, then mcheck's mprobe of each block when argv[1] is "mcheck" (the program is
 * then run with MALLOC_CHECK_ unset: mcheck must come before the first allocation). Prints
 * "ok". Under MALLOC_CHECK_=3 glibc's checks abort on a block they did not make. */
#define _GNU_SOURCE
#include <malloc.h>
#include <mcheck.h>
#include "check.h"

int main(int argc, char **argv) {
    int checking = argc > 1 && !strcmp(argv[1], "mcheck");
    if (checking) CHECK(mcheck(NULL) == 0);
    void *blocks[9];
    blocks[0] = malloc(100);
    blocks[1] = malloc(8 * MB);
    blocks[2] = calloc(1, 6 * MB);
    blocks[3] = reallocarray(NULL, 5, MB);
    blocks[4] = memalign(1 << 21, 5 * MB);
    CHECK(posix_memalign(&blocks[5], 4096, 5 * MB) == 0);
    blocks[6] = aligned_alloc(64, 4 * MB);
    blocks[7] = realloc(malloc(1000), 7 * MB);
    blocks[8] = reallocarray(malloc(10), 8, MB);
    for (int i = 0; i < 9; i++) {
        CHECK(blocks[i]);
        CHECK(malloc_usable_size(blocks[i]) >= (i == 0 ? 100 : 4 * MB));
        if (checking) CHECK(mprobe(blocks[i]) == MCHECK_OK);
    }
    blocks[1] = realloc(blocks[1], 12 * MB);
    blocks[2] = realloc(blocks[2], 300);
    CHECK(blocks[1] && blocks[2]);
    for (int i = 0; i < 9; i++) free(blocks[i]);
    printf("ok\n");
    return 0;
}
