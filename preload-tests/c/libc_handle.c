/* Calls reached through libc's handle, not by symbol (dlsym(dlopen("libc.so.6"), NAME), as
 * Python's ctypes.CDLL("libc.so.6") does): a large block from malloc is measured, grown, freed
 * through the handle; a block protected read-only through the handle and freed comes back
 * writable. Note [Calls through a library's handle] in src/route/control.rs. Prints
 * "libc handle ok". */
#define _GNU_SOURCE
#include "check.h"
#include <malloc.h>
#include <sys/mman.h>

int main(void) {
    /* glibc alone: every 8 MiB block its own mapping, unmapped at its free (no threshold that
     * rises with the frees, which would put a protected page in glibc's heap). */
    CHECK(mallopt(M_MMAP_THRESHOLD, 1024 * 1024) == 1);
    void *libc_handle = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    CHECK(libc_handle);
    void (*c_free)(void *) = (void (*)(void *))dlsym(libc_handle, "free");
    void *(*c_realloc)(void *, size_t) = (void *(*)(void *, size_t))dlsym(libc_handle, "realloc");
    size_t (*c_usable)(void *) = (size_t (*)(void *))dlsym(libc_handle, "malloc_usable_size");
    int (*c_mprotect)(void *, size_t, int) = (int (*)(void *, size_t, int))dlsym(libc_handle, "mprotect");
    CHECK(c_free && c_realloc && c_usable && c_mprotect);
    for (int round = 0; round < 3; round++) {
        size_t n = 8 * MB;
        char *p = malloc(n);
        CHECK(p);
        memset(p, 0x5a, n);
        CHECK(c_usable(p) >= n);
        p = c_realloc(p, 2 * n);
        CHECK(p && p[0] == 0x5a && p[n - 1] == 0x5a);
        memset(p, 0x33, 2 * n);
        c_free(p);
        char *q = aligned_alloc(4096, n); /* page-aligned under glibc too */
        CHECK(q);
        CHECK(c_mprotect(q, 4096, PROT_READ) == 0);
        free(q);
        char *r = malloc(n);
        CHECK(r);
        memset(r, 7, n); /* faults if a read-only page came back */
        c_free(r);
    }
    char *small = malloc(100);
    CHECK(small);
    c_free(small);
    puts("libc handle ok");
    return 0;
}
