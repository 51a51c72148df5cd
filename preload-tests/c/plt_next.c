/* A next allocator that calls back into the malloc family through the PLT, as allocators built
 * over malloc (debugging layers, old runtimes) do: its calloc is malloc + memset and its realloc
 * is malloc + memcpy + free, all through the exported names, so under
 * LD_PRELOAD="libtensormalloc.so libplt_next.so" each such call re-enters tensormalloc while it
 * is inside the next allocator. malloc and free are glibc's own. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);

static volatile uint64_t reentries; /* calls that went back out through the PLT */

void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }

void *calloc(size_t count, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(count, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    reentries++;
    void *p = (malloc)(n); /* through the PLT: the first malloc in the process, tensormalloc's */
    if (p) memset(p, 0, n);
    return p;
}

void *realloc(void *p, size_t n) {
    reentries++;
    if (!p) return (malloc)(n);
    if (n == 0) {
        (free)(p);
        return NULL;
    }
    void *q = (malloc)(n);
    if (!q) return NULL;
    size_t old = malloc_usable_size(p);
    memcpy(q, p, old < n ? old : n);
    (free)(p);
    return q;
}

uint64_t plt_next_reentries(void) { return reentries; }
