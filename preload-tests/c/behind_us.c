/* Under a hook or tracer preloaded after us: small and large blocks malloc'd, written, freed;
 * a small block realloc'd past the threshold keeps its bytes; an mmap and its munmap. Prints
 * "behind us ok". */
#include "check.h"
#include <sys/mman.h>

int main(void) {
    for (int i = 0; i < 5; i++) {
        char *p = malloc(100);
        char *q = malloc(300000);
        CHECK(p && q);
        memset(q, 1, 300000);
        free(p);
        free(q);
    }
    for (int i = 0; i < 5; i++) {
        char *r = malloc(100);
        CHECK(r);
        for (int k = 0; k < 100; k++) r[k] = (char)k;
        r = realloc(r, 500000 + i * 4096 * 64);
        CHECK(r);
        for (int k = 0; k < 100; k++) CHECK(r[k] == (char)k);
        memset(r + 100, 2, 400000);
        free(r);
    }
    void *m = mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED && munmap(m, 4096) == 0);
    puts("behind us ok");
    return 0;
}
