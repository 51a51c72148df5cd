/* What a malloc tracer built as its own shared library needs before it can call the next
 * allocator: the next malloc, calloc, realloc and free by dlsym(RTLD_NEXT), and a scratch area
 * for the calls dlsym itself makes meanwhile (from_scratch, in 4 KiB pieces; never freed).
 * Included by the test tracers (locking_tracer.c, header_tracer.c). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

static void *(*next_malloc)(size_t);
static void (*next_free)(void *);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static __thread int resolving;
static char scratch[1 << 16];
static size_t scratch_used;

static int in_scratch(void *p) { return (char *)p >= scratch && (char *)p < scratch + sizeof scratch; }

static void resolve(void) {
    if (next_malloc) return;
    resolving = 1;
    next_calloc = dlsym(RTLD_NEXT, "calloc");
    next_free = dlsym(RTLD_NEXT, "free");
    next_realloc = dlsym(RTLD_NEXT, "realloc");
    next_malloc = dlsym(RTLD_NEXT, "malloc");
    resolving = 0;
}

static void *from_scratch(size_t n) {
    void *p = scratch + scratch_used;
    scratch_used += n <= 4096 ? 4096 : (n + 4095) & ~(size_t)4095;
    return p;
}
