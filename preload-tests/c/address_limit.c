/* Under an address-space limit (RLIMIT_AS, as `ulimit -v` sets, or RLIMIT_DATA, `ulimit -d`,
 * which counts private writable mappings), memory the program frees must
 * leave room for what it maps next, as under glibc alone, which unmaps large blocks at free:
 * after freeing a 1 GiB block, 500 MiB of 1000-byte mallocs (the next allocator's heap, grown by
 * brk), 900 mallocs of 1 MiB, a 900 MiB mmap and 64 threads all succeed.
 * A 64 TiB request fails with ENOMEM and leaves the cache as it was.
 * Usage: address_limit LIMIT_MIB [data] */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include "check.h"

static void *idle(void *arg) { return arg; }

int main(int argc, char **argv) {
    size_t limit = (size_t)atol(argc > 1 ? argv[1] : "2048") << 20;
    struct rlimit rl = { limit, limit };
    CHECK(setrlimit(argc > 2 && strcmp(argv[2], "data") == 0 ? RLIMIT_DATA : RLIMIT_AS, &rl) == 0);

    char *big = malloc((size_t)1 << 30);
    CHECK(big != NULL);
    memset(big, 1, (size_t)1 << 30);
    free(big);

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
