/* Run with another allocator preloaded in front of us: the names it lacks reach us
 * (reallocarray, which coreutils call; free_sized where the C library has it), for blocks that
 * are its own (Note [An allocator in front of us] in src/sys/front.rs). Small and large blocks,
 * contents kept. Prints "front ok". */
#define _GNU_SOURCE
#include "check.h"

int main(void) {
    void (*sized_free)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    for (size_t n = 64; n <= 16 * MB; n *= 16) {
        char *p = malloc(n);
        CHECK(p);
        memset(p, 0x42, n);
        for (size_t k = 2; k <= 4; k++) {
            p = reallocarray(p, k, n);
            CHECK(p && p[0] == 0x42 && p[n - 1] == 0x42);
        }
        free(p);
        CHECK(reallocarray(NULL, SIZE_MAX / 2, 3) == NULL && errno == ENOMEM);
        if (sized_free) {
            char *q = malloc(n);
            CHECK(q);
            q[0] = 1;
            sized_free(q, n);
        }
    }
    puts("front ok");
    return 0;
}
