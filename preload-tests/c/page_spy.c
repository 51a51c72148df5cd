/* A library preloaded after the allocator that hooks the page calls, as gperftools' mmap hooks or
 * a tracer do: each call is counted (spy_count, spy_reset) and goes on to the next definition.
 * With tensormalloc preloaded first, the program's calls reach it only if tensormalloc passes
 * them on (Note [The next interposer] in src/sys/page_calls.rs). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/types.h>

static atomic_long calls;

long spy_count(void) { return atomic_load(&calls); }
void spy_reset(void) { atomic_store(&calls, 0); }

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef int (*range_fn)(void *, size_t);
typedef int (*prot_fn)(void *, size_t, int);
typedef int (*pkey_fn)(void *, size_t, int, int);
typedef void *(*mremap_fn)(void *, size_t, size_t, int, void *);
typedef int (*lock_fn)(const void *, size_t);

/* The next definition of `name`, looked up once; the call counted. */
#define NEXT(type, name) \
    static type next; \
    if (!next) next = (type)dlsym(RTLD_NEXT, name); \
    atomic_fetch_add(&calls, 1)

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    NEXT(mmap_fn, "mmap");
    return next(addr, len, prot, flags, fd, off);
}

int munmap(void *addr, size_t len) {
    NEXT(range_fn, "munmap");
    return next(addr, len);
}

int mprotect(void *addr, size_t len, int prot) {
    NEXT(prot_fn, "mprotect");
    return next(addr, len, prot);
}

int pkey_mprotect(void *addr, size_t len, int prot, int key) {
    NEXT(pkey_fn, "pkey_mprotect");
    return next(addr, len, prot, key);
}

int madvise(void *addr, size_t len, int advice) {
    NEXT(prot_fn, "madvise");
    return next(addr, len, advice);
}

void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
    NEXT(mremap_fn, "mremap");
    va_list ap;
    va_start(ap, flags);
    void *new_addr = (flags & MREMAP_FIXED) ? va_arg(ap, void *) : (void *)0;
    va_end(ap);
    return next(old, old_len, new_len, flags, new_addr);
}

int mlock(const void *addr, size_t len) {
    NEXT(lock_fn, "mlock");
    return next(addr, len);
}

int munlock(const void *addr, size_t len) {
    NEXT(lock_fn, "munlock");
    return next(addr, len);
}
