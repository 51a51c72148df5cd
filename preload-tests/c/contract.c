/* The C contract of the malloc family, on both sides of the threshold. */
#include "check.h"
#include <malloc.h>
#include <sys/mman.h>

static void check_aligned_family(size_t size) {
    for (size_t align = sizeof(void *); align <= 64 * MB; align <<= 1) {
        void *p = NULL;
        CHECK(posix_memalign(&p, align, size) == 0);
        CHECK(((uintptr_t)p & (align - 1)) == 0);
        CHECK(malloc_usable_size(p) >= size);
        memset(p, 0xab, size);
        free(p);
        p = aligned_alloc(align, size);
        CHECK(p && ((uintptr_t)p & (align - 1)) == 0);
        free(p);
        p = memalign(align, size);
        CHECK(p && ((uintptr_t)p & (align - 1)) == 0);
        free(p);
    }
}

int main(void) {
    size_t t = env_size("TENSORMALLOC_THRESHOLD", 128 << 10);

    void *p = malloc(0);
    CHECK(p != NULL);
    free(p);
    free(NULL);

    p = realloc(NULL, 100);
    CHECK(p != NULL);
    p = realloc(p, 0); /* glibc: frees, returns NULL */
    CHECK(p == NULL);
    p = realloc(NULL, t);
    CHECK(p != NULL);
    p = realloc(p, 0);
    CHECK(p == NULL);

    /* free leaves errno alone (POSIX 2024, glibc since 2.33), also for a block whose pages
     * the program changed (the reset's system calls may fail on it). */
    for (int taint = 0; taint < 2; taint++) {
        char *b = malloc(t);
        CHECK(b != NULL);
        memset(b, 1, t);
        if (taint) mprotect(b, 4096, PROT_READ);
        errno = EAGAIN;
        free(b);
        CHECK(errno == EAGAIN);
    }

    /* A call that succeeds leaves errno alone (Note [errno on success] in src/route.rs): a
     * realloc that cannot grow its block in place (a mapping right after it) moves it, and
     * getline's idiom (clear errno, read to the end, test errno) sees no read error. */
    for (int how = 0; how < 2; how++) {
        unsigned char *b = malloc(2 * t);
        CHECK(b != NULL);
        fill(b, 2 * t, 3);
        uintptr_t end = ((uintptr_t)b + malloc_usable_size(b) + 4095) & ~(uintptr_t)4095;
        void *wall = mmap((void *)end, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        errno = 0;
        b = how ? reallocarray(b, 8, t) : realloc(b, 8 * t);
        CHECK(b && errno == 0 && filled(b, 2 * t, 3));
        free(b);
        if (wall != MAP_FAILED) munmap(wall, 4096);
    }
    FILE *lines = tmpfile();
    CHECK(lines != NULL);
    for (size_t k = 0; k < 3 * t; k++) fputc('a', lines);
    fputc('\n', lines);
    rewind(lines);
    char *line = NULL;
    size_t cap = 0, got = 0;
    ssize_t n;
    errno = 0;
    while ((n = getline(&line, &cap, lines)) != -1) got += (size_t)n;
    CHECK(errno == 0 && got == 3 * t + 1);
    free(line);
    fclose(lines);

    /* volatile: the compiler must not fold these calls away */
    volatile size_t half = SIZE_MAX / 2, huge = SIZE_MAX - 4096;
    errno = 0;
    CHECK(calloc(half, 4) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(malloc(huge) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(reallocarray(NULL, half, 4) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(1, huge) == NULL && errno == ENOMEM);

    void *q = (void *)1;
    CHECK(posix_memalign(&q, 3, 100) == EINVAL && q == (void *)1);
    CHECK(posix_memalign(&q, 4, 100) == EINVAL);       /* not a multiple of sizeof(void*) */
    CHECK(posix_memalign(&q, 24, t) == EINVAL);
    CHECK(posix_memalign(&q, 0, t) == EINVAL);

    size_t sizes[] = {t - 1, t, t + 1, 3 * t + 12345};
    for (unsigned i = 0; i < 4; i++) {
        size_t n = sizes[i];
        unsigned char *c = calloc(1, n);
        CHECK(c && malloc_usable_size(c) >= n);
        for (size_t k = 0; k < n; k += 509) CHECK(c[k] == 0);
        CHECK(c[n - 1] == 0);
        memset(c, 0x5a, n);
        free(c);
        c = calloc(n, 1); /* likely the block just freed: must be zero again */
        for (size_t k = 0; k < n; k += 509) CHECK(c[k] == 0);
        CHECK(c[n - 1] == 0);
        free(c);
        c = malloc(n);
        fill(c, n, i);
        CHECK(filled(c, n, i));
        free(c);
    }

    /* realloc across the threshold, both ways, keeping contents */
    unsigned char *r = malloc(1000);
    fill(r, 1000, 9);
    r = realloc(r, 2 * t);
    CHECK(r && filled(r, 1000, 9));
    fill(r, 2 * t, 10);
    r = realloc(r, 8 * t); /* grow a large block: mremap */
    CHECK(r && filled(r, 2 * t, 10));
    r = realloc(r, t + 4096); /* shrink in place */
    CHECK(r && r[0] == 10 && r[4096] == 11);
    r = realloc(r, 1000); /* back below the threshold */
    CHECK(r && r[0] == 10 && malloc_usable_size(r) >= 1000);
    free(r);

    p = valloc(t);
    CHECK(p && ((uintptr_t)p & 4095) == 0);
    free(p);
    p = pvalloc(1);
    CHECK(p && ((uintptr_t)p & 4095) == 0 && malloc_usable_size(p) >= 4096);
    free(p);
    p = pvalloc(t + 1);
    CHECK(p && malloc_usable_size(p) >= t + 4096);
    free(p);

    check_aligned_family(100);
    check_aligned_family(t + 100);

    tm_stats_t s;
    if (tm_stats(&s) == 0 && s.enabled) {
        CHECK(s.threshold_bytes == t);
        CHECK(s.host_requests > 20);
        /* With no expiry delay the reaper thread may unmap each freed block before the next
         * request asks for it (seen under CPU load): a hit is certain only with a delay. */
        const char *expire = getenv("TENSORMALLOC_HOST_UNMAP_MS");
        if (!expire || strcmp(expire, "0") != 0) CHECK(s.host_hits > 0);
        CHECK(s.host_live_bytes == 0);
    }
    puts("contract ok");
    return 0;
}
