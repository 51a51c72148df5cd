/* A hook preloaded after us that finds "the real" functions through libc's handle, as some
 * tracers do: dlsym(dlopen("libc.so.6", RTLD_NOLOAD), name) for malloc, free, mmap and munmap,
 * which it defines itself. Counts its calls; prints "handle hook: N calls" at exit. Built as a
 * shared library by the test. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static long calls;
static __thread int resolving;
static char scratch[1 << 16];
static size_t scratch_used;

static void *real(const char *name) {
    resolving = 1;
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *f = libc ? dlsym(libc, name) : NULL;
    resolving = 0;
    return f;
}

void *malloc(size_t n) {
    static void *(*f)(size_t);
    if (resolving) {
        void *p = scratch + scratch_used;
        scratch_used += (n + 15) & ~(size_t)15;
        return p;
    }
    if (!f) f = real("malloc");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return f(n);
}

void free(void *p) {
    static void (*f)(void *);
    if ((char *)p >= scratch && (char *)p < scratch + sizeof scratch) return;
    if (!f) f = real("free");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    f(p);
}

void *mmap(void *a, size_t l, int p, int fl, int fd, off_t o) {
    static void *(*f)(void *, size_t, int, int, int, off_t);
    if (!f) f = real("mmap");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return f(a, l, p, fl, fd, o);
}

int munmap(void *a, size_t l) {
    static int (*f)(void *, size_t);
    if (!f) f = real("munmap");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return f(a, l);
}

__attribute__((destructor)) static void report(void) {
    char line[64];
    int k = snprintf(line, sizeof line, "handle hook: %ld calls\n", calls);
    if (k > 0) (void)!write(1, line, (size_t)k);
}
