/* libspy.so for test_holders.py: a next allocator behind tensormalloc (preloaded after it) that
 * counts the calls it gets while armed, so a test can check that a report made no allocation;
 * a request of the watched size (one tensormalloc could not map, handed on to the next
 * allocator before it fails) is counted apart. */
#include <stddef.h>

void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);
void __libc_free(void *);

static volatile int armed;
static volatile long calls, watched_calls;
static volatile size_t watched;

void spy_arm(int on) { armed = on; }
void spy_watch(size_t n) { watched = n; }
long spy_calls(void) { return calls; }
long spy_watched_calls(void) { return watched_calls; }

static void count(size_t n) {
    if (armed && n == watched) watched_calls++;
    else if (armed) calls++;
}

void *malloc(size_t n) { count(n); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { count(a * b); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { count(n); return __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }
void *memalign(size_t a, size_t n) { count(n); return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { count(n); return __libc_memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n) {
    count(n);
    void *p = __libc_memalign(a, n);
    if (!p) return 12;
    *out = p;
    return 0;
}
