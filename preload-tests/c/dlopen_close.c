/* The library dlopened (not preloaded), used through the numpy handler's entry points so that a
 * large block is cached and our background thread runs, then dlclosed: `dlopen_close LIB`. The
 * library stays mapped (it is marked never to be unloaded): before, dlclose unmapped it and the
 * thread faulted at its next pass. Prints "dlclose 0, still loaded yes" and, 2 s later (past the
 * release delay the test sets), "alive". */
#include <dlfcn.h>
#include <unistd.h>
#include "check.h"

int main(int argc, char **argv) {
    CHECK(argc > 1);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    void *(*tm_malloc)(void *, size_t) = (void *(*)(void *, size_t))dlsym(h, "tm_numpy_malloc");
    void (*tm_free)(void *, void *, size_t) = (void (*)(void *, void *, size_t))dlsym(h, "tm_numpy_free");
    CHECK(tm_malloc && tm_free);
    for (int i = 0; i < 3; i++) {
        void *p = tm_malloc(NULL, 64 * MB);
        CHECK(p != NULL);
        memset(p, i, 64 * MB);
        tm_free(NULL, p, 64 * MB);
    }
    int rc = dlclose(h);
    printf("dlclose %d, still loaded %s\n", rc, dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD) ? "yes" : "no");
    fflush(stdout);
    sleep(2);
    puts("alive");
    return 0;
}
