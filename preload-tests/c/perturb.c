/* glibc's perturbation (MALLOC_PERTURB_=165, or mallopt(M_PERTURB, 165) with argv[1] "mallopt"):
 * every block malloc hands out reads 165 ^ 0xff (0x5a), the first time and after a previous
 * owner wrote it, large and mid-size alike (Note [Memory debuggers] in src/state.rs). Prints the
 * first and middle byte of each. */
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
    if (argc > 1 && !strcmp(argv[1], "mallopt")) CHECK(mallopt(M_PERTURB, 165) == 1);
    show("large", 8 * MB, 1);
    show("large-again", 8 * MB, 0);
    show("mid", 200 << 10, 1);
    show("mid-again", 200 << 10, 0);
    return 0;
}
