/* The library loaded with dlmopen(LM_ID_NEWLM) (not preloaded: a namespace of its own, with its
 * own glibc) serves numpy's hooks (tm_numpy_malloc/free) in three rounds; between them the cache
 * empties and our thread ends, so each round makes it again. That namespace's glibc frees a
 * thread's TLS its caller's glibc allocated when a thread is made again, unless the TLS fits in
 * what it keeps spare (Note [Scopes off the thread's stack] in src/record/scopes.rs).
 * Usage: second_namespace LIBRARY; prints "rounds 3". */
#include "check.h"
#include <unistd.h>

int main(int argc, char **argv) {
    CHECK(argc == 2);
    void *lib = dlmopen(LM_ID_NEWLM, argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "dlmopen: %s\n", dlerror());
        return 1;
    }
    void *(*tm_malloc)(void *, size_t) = (void *(*)(void *, size_t))dlsym(lib, "tm_numpy_malloc");
    void (*tm_free)(void *, void *, size_t) = (void (*)(void *, void *, size_t))dlsym(lib, "tm_numpy_free");
    CHECK(tm_malloc && tm_free);
    int rounds = 0;
    for (; rounds < 3; rounds++) {
        for (int k = 0; k < 3; k++) {
            char *q = tm_malloc(NULL, 16 * MB);
            CHECK(q);
            memset(q, k + 1, 16 * MB);
            tm_free(NULL, q, 16 * MB);
        }
        usleep(1800 * 1000); /* released, unmapped, and our thread ended */
    }
    printf("rounds %d\n", rounds);
    return 0;
}
