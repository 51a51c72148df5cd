/* A tracer preloaded in front of us (LD_PRELOAD="liblocking_tracer.so libtensormalloc.so"), as
 * simple ones are written: the next malloc, free, calloc and realloc by dlsym(RTLD_NEXT), each
 * called under one plain (non-recursive) mutex, a scratch area for the calls dlsym makes. Counts
 * the calls; prints "locking tracer: N calls" at exit. Built as a shared library by the test. */
#include "tracer.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long calls;

void *malloc(size_t n) {
    if (resolving) return from_scratch(0);
    resolve();
    pthread_mutex_lock(&lock);
    void *p = next_malloc(n);
    calls++;
    pthread_mutex_unlock(&lock);
    return p;
}

void *calloc(size_t count, size_t size) {
    if (resolving) return from_scratch(0);
    resolve();
    pthread_mutex_lock(&lock);
    void *p = next_calloc(count, size);
    calls++;
    pthread_mutex_unlock(&lock);
    return p;
}

void *realloc(void *p, size_t n) {
    if (in_scratch(p)) {
        void *q = malloc(n);
        memcpy(q, p, n < 4096 ? n : 4096);
        return q;
    }
    resolve();
    pthread_mutex_lock(&lock);
    void *q = next_realloc(p, n);
    calls++;
    pthread_mutex_unlock(&lock);
    return q;
}

void free(void *p) {
    if (!p || in_scratch(p)) return;
    resolve();
    pthread_mutex_lock(&lock);
    next_free(p);
    calls++;
    pthread_mutex_unlock(&lock);
}

__attribute__((destructor)) static void report(void) {
    char line[64];
    int n = snprintf(line, sizeof line, "locking tracer: %ld calls\n", calls);
    if (write(1, line, (size_t)n) < 0) return;
}
