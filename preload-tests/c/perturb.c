/* glibc's perturbation (MALLOC_PERTURB_=165, or mallopt(M_PERTURB, 165) with argv[1] "mallopt"):
 * every block malloc hands out reads 165 ^ 0xff (0x5a), the first time and after a previous
 * owner wrote it, large and mid-size alike (Note [Memory debuggers] in src/state.rs). Prints the
 * first and middle byte of each. "mallopt-negative" asks -91 (the same byte); "mallopt-composed"
 * turns the cache off by M_MMAP_MAX = 0 too and takes that back. */
#include <malloc.h>
#include "check.h"

static void show(const char *what, size_t size, int write_after) {
    unsigned char *p = malloc(size);
    CHECK(p);
    printf("%s %02x %02x\n", what, p[0], p[size / 2]);
    if (write_after) memset(p, 0x11, size);
    free(p);
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "";
    if (!strcmp(how, "mallopt")) CHECK(mallopt(M_PERTURB, 165) == 1);
    if (!strcmp(how, "mallopt-negative")) CHECK(mallopt(M_PERTURB, -91) == 1);
    if (!strcmp(how, "mallopt-composed")) {
        /* The cache turned off twice, then one reason taken back: still off. */
        CHECK(mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_PERTURB, 165) == 1 && mallopt(M_MMAP_MAX, 65536) == 1);
    }
    show("large", 8 * MB, 1);
    show("large-again", 8 * MB, 0);
    show("mid", 200 << 10, 1);
    show("mid-again", 200 << 10, 0);
    return 0;
}
