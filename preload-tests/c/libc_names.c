/* glibc's own names for the malloc family, called directly (as debugging tools and old hooks
 * do), mixed with the plain names: a block is freed by whoever owns it, whichever name frees
 * it, and every block is plain, usable memory of the size asked. */
#include "check.h"
#include <malloc.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern void __libc_free(void *);



static void put(unsigned char *p, size_t n, unsigned char v) {
    CHECK(p != NULL);
    for (size_t i = 0; i < n; i += 512) p[i] = v;
}

static void seen(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i += 512) CHECK(p[i] == v);
}

int main(void) {
    for (int round = 0; round < 20; round++) {
        size_t sizes[] = {40 * MB, 100, 5 * MB, 4096};
        for (int s = 0; s < 4; s++) {
            size_t n = sizes[s];
            unsigned char *a = malloc(n);
            put(a, n, 1);
            __libc_free(a); /* the crash this test was written for: our block, glibc's name */
            unsigned char *b = __libc_malloc(n);
            put(b, n, 2);
            CHECK(malloc_usable_size(b) >= n);
            free(b);
            unsigned char *c = __libc_calloc(n / 4, 4);
            seen(c, n, 0);
            put(c, n, 3);
            c = __libc_realloc(c, 2 * n);
            seen(c, n, 3);
            c = realloc(c, n / 2 + 1);
            seen(c, n / 2, 3);
            __libc_free(c);
            unsigned char *d = __libc_memalign(1 << 16, n);
            CHECK(((size_t)d & 0xffff) == 0);
            put(d, n, 4);
            free(d);
            unsigned char *e = __libc_valloc(n);
            CHECK(((size_t)e & 4095) == 0);
            put(e, n, 5);
            __libc_free(e);
            unsigned char *f = __libc_pvalloc(n);
            CHECK(((size_t)f & 4095) == 0);
            put(f, n, 6);
            free(f);
        }
    }
    __libc_free(NULL);
    CHECK(__libc_realloc(NULL, 10) != NULL);
    printf("libc names ok\n");
    return 0;
}
