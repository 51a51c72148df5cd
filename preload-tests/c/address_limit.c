/* Under an address-space limit (RLIMIT_AS, as `ulimit -v` sets, or RLIMIT_DATA, `ulimit -d`,
 * which counts private writable mappings), memory the program frees must
 * leave room for what it maps next, as under glibc alone, which unmaps large blocks at free:
 * after freeing a 1 GiB block, 500 MiB of 1000-byte mallocs (the next allocator's heap, grown by
 * brk), 900 mallocs of 1 MiB, a 900 MiB mmap and 64 threads all succeed.
 * A 64 TiB request fails with ENOMEM and leaves the cache as it was.
 * With a third argument N the program first calls mallopt(M_TRIM_THRESHOLD, N), as real-time
 * programs do (-1: "never trim"): glibc still unmaps at free, whatever N, so right after the
 * free at least 1200 MiB of the limit is not mapped (VmSize, or VmData under RLIMIT_DATA).
 * Usage: address_limit LIMIT_MIB [as|data] [N] */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include "check.h"

static void *idle(void *arg) { return arg; }

/* A /proc/self/status figure, in KiB. */
static size_t vm_kib(const char *name) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, name, strlen(name)) == 0) kib = strtoull(line + strlen(name), NULL, 10);
    }
    if (f) fclose(f);
    return kib;
}

int main(int argc, char **argv) {
    size_t limit = (size_t)atol(argc > 1 ? argv[1] : "2048") << 20;
    if (argc > 3) CHECK(mallopt(M_TRIM_THRESHOLD, atoi(argv[3])) == 1);
    struct rlimit rl = { limit, limit };
    CHECK(setrlimit(argc > 2 && strcmp(argv[2], "data") == 0 ? RLIMIT_DATA : RLIMIT_AS, &rl) == 0);

    char *big = malloc((size_t)1 << 30);
    CHECK(big != NULL);
    memset(big, 1, (size_t)1 << 30);
    free(big);
    if (argc > 3) {
        /* What never passes through malloc (a brk heap of the program's own, a stack, a shmat
         * segment, a library dlopen maps) finds the room too: the limit less what is mapped. */
        size_t used = vm_kib(strcmp(argv[2], "data") == 0 ? "VmData:" : "VmSize:") << 10;
        printf("room under the limit: %zu MiB\n", (limit - used) >> 20);
        CHECK(used < limit && limit - used >= (size_t)1200 << 20);
    }

    enum { PIECES = 500 * 1024 };
    static void *piece[PIECES];
    CHECK(small_blocks(piece, PIECES) == PIECES);

    enum { N = 900 };
    static char *small[N];
    int got = 0;
    for (int i = 0; i < N; i++) {
        small[i] = malloc(1 << 20);
        if (small[i]) {
            small[i][0] = 1;
            got++;
        }
    }
    printf("1 MiB mallocs: %d of %d\n", got, N);
    CHECK(got == N);
    for (int i = 0; i < N; i++) free(small[i]);

    void *map = mmap(NULL, 900 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("900 MiB mmap: %s\n", map == MAP_FAILED ? strerror(errno) : "ok");
    CHECK(map != MAP_FAILED);
    munmap(map, 900 << 20);

    /* Cache a 64 MiB block, then ask for 64 TiB: refused, and the block is still reused. */
    char *a = malloc(64 << 20);
    CHECK(a != NULL);
    memset(a, 2, 64 << 20);
    free(a);
    errno = 0;
    void *huge = malloc((size_t)64 << 40);
    CHECK(huge == NULL && errno == ENOMEM);
    char *b = malloc(64 << 20);
    CHECK(b != NULL);
    printf("64 MiB block after a refused 64 TiB request: %s\n", b == a ? "reused" : "new");
    free(b);

    pthread_t t[64];
    int threads = 0;
    for (int i = 0; i < 64; i++) {
        if (pthread_create(&t[threads], NULL, idle, NULL) == 0) threads++;
    }
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("threads: %d of 64\n", threads);
    CHECK(threads == 64);
    printf("address limit ok\n");
    return 0;
}
