/* A tracer written as glibc's memusage is: each block it hands out carries a 16-byte header of
 * its own (a magic word and the size) in front; its free and realloc read the 16 bytes before
 * any pointer they are given, and hand one without the magic straight to the next free or
 * realloc. It defines malloc, calloc, realloc and free only (no aligned names, no
 * malloc_usable_size). Counts its calls; prints "header tracer: malloc M free F" at exit.
 * Preloaded in front of us or after us; built as a shared library by the test. */
#include "tracer.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAGIC 0xfeedbeefbadc0ffeULL
struct header { uint64_t magic; size_t size; };

static long mallocs, frees;

void *malloc(size_t n) {
    if (resolving) return from_scratch(n);
    resolve();
    struct header *h = next_malloc(n + sizeof *h);
    if (!h) return NULL;
    __atomic_add_fetch(&mallocs, 1, __ATOMIC_RELAXED);
    h->magic = MAGIC;
    h->size = n;
    return h + 1;
}

void *calloc(size_t count, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(count, size, &n)) return NULL;
    void *p = malloc(n);
    if (p) memset(p, 0, n);
    return p;
}

/* Reads the bytes before p whoever's block it is, as memusage's free does. */
static struct header *own(void *p) {
    struct header *h = (struct header *)p - 1;
    return h->magic == MAGIC ? h : NULL;
}

void free(void *p) {
    if (!p || in_scratch(p)) return;
    resolve();
    struct header *h = own(p);
    if (!h) {
        next_free(p);
        return;
    }
    __atomic_add_fetch(&frees, 1, __ATOMIC_RELAXED);
    h->magic = 0;
    next_free(h);
}

void *realloc(void *p, size_t n) {
    if (!p) return malloc(n);
    resolve();
    struct header *h = own(p);
    if (!h) return next_realloc(p, n);
    struct header *q = next_realloc(h, n + sizeof *q);
    if (!q) return NULL;
    q->size = n;
    return q + 1;
}

__attribute__((destructor)) static void report(void) {
    char line[96];
    int k = snprintf(line, sizeof line, "header tracer: malloc %ld free %ld\n", mallocs, frees);
    if (k > 0) (void)!write(1, line, (size_t)k);
}
