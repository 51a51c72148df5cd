/* realloc grows a 256 MiB block to 512 MiB that cannot grow in place (a mapping right after
 * it), under a limit on address space (RLIMIT_AS, or RLIMIT_DATA) with room for the new length
 * and 32 MiB more, not for the old and the new at once. glibc's mremap(MREMAP_MAYMOVE) needs
 * only the new length; so must we (Note [Growing under a limit] in
 * src/host/host_layer/resize.rs): the block grows, its contents kept. */
#include "check.h"
#include <malloc.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    int data = argc > 1 && strcmp(argv[1], "data") == 0;
    size_t n = 256 * MB;
    unsigned char *p = malloc(n);
    CHECK(p != NULL);
    fill(p, n, 5);
    uintptr_t end = ((uintptr_t)p + malloc_usable_size(p) + 4095) & ~(uintptr_t)4095;
    void *wall = mmap((void *)end, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(wall != MAP_FAILED || errno == EEXIST);
    if (data) {
        struct rlimit rl = {(rlim_t)(status_kb("VmData") * 1024 + n + 32 * MB), RLIM_INFINITY};
        CHECK(setrlimit(RLIMIT_DATA, &rl) == 0);
    } else {
        limit_address_space((long)(n + 32 * MB));
    }
    errno = 0;
    unsigned char *q = realloc(p, 2 * n);
    printf("realloc 256 MiB -> 512 MiB under the limit: %s\n", q ? "grown" : "refused");
    CHECK(q != NULL && errno == 0);
    CHECK(filled(q, n, 5));
    memset(q + n, 1, n);
    free(q);
    puts("realloc limit ok");
    return 0;
}
