/* A block a thread frees and asks for again (Note [A thread's own slot]): `thread_slots MODE`.
 *   counts   1000 malloc/write/free pairs of 8 MiB: the figures count each as a request, a hit
 *            and a free, the block ends cached, mallinfo2 says nothing is in use;
 *   threads  8 threads, each with its own size, 3000 pairs, each block stamped with its thread
 *            and checked before its free: no block is ever two threads' at once;
 *   crowd    the same with 40 threads alive at once, more than there are slots (32): the
 *            later ones use the cache, no two share a slot;
 *   generations  40 threads one after another, each ending before the next starts (most
 *            start on the stack, and with the thread pointer, of the one before, whose slot
 *            they take over), 500 pairs each: the figures add up, nothing stays live;
 *   fork     a block freed, then a fork: parent and child each take the size again and write it;
 *   idle     64 MiB written whole and freed; 600 ms later (TENSORMALLOC_HOST_RELEASE_MS=100 and
 *            _RELEASE=now) RSS has fallen by it;
 *   mapped   a block freed, then the program maps pages of its own over its addresses
 *            (MAP_FIXED, as it may where glibc unmapped it): they are its own, and stay;
 *   trim     a block freed, then malloc_trim(0): RSS falls by it.
 * Runs beside glibc alone too (the figures only where tm_get_stats is found). */
#include "check.h"
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    CHECK(f && fscanf(f, "%ld %ld", &size, &resident) == 2);
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void wait_a_while(void) { usleep(600000); }
static void trim(void) { malloc_trim(0); }

/* 64 MiB written whole and freed: after `give_back`, RSS has fallen by it. */
static void rss_falls_after(void (*give_back)(void), const char *when) {
    char *p = malloc(64 * MB);
    CHECK(p);
    memset(p, 1, 64 * MB);
    long full = rss_kb();
    free(p);
    give_back();
    long after = rss_kb();
    fprintf(stderr, "rss %ld kB written, %ld kB %s\n", full, after, when);
    CHECK(full - after > 60 * 1024);
}

static int pairs = 3000;

static void *churn(void *arg) {
    long id = (long)arg;
    size_t n = (4 + id % 8) * MB + 4096 * id;
    for (int i = 0; i < pairs; i++) {
        volatile long *p = malloc(n);
        CHECK(p);
        p[0] = id;
        p[n / sizeof(long) - 1] = id;
        for (int spin = 0; spin < 50; spin++) CHECK(p[0] == id);
        CHECK(p[0] == id && p[n / sizeof(long) - 1] == id);
        free((void *)p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *mode = argv[1];
    tm_stats_t s;
    if (!strcmp(mode, "counts")) {
        tm_stats_t before;
        int ours = tm_stats(&before) == 0;
        for (int i = 0; i < 1000; i++) {
            char *p = malloc(8 * MB);
            CHECK(p);
            p[i] = 1;
            free(p);
        }
        if (ours) {
            CHECK(tm_stats(&s) == 0);
            fprintf(stderr, "requests %llu hits %llu frees %llu live %llu cached %llu\n", (unsigned long long)(s.host_requests - before.host_requests),
                    (unsigned long long)(s.host_hits - before.host_hits), (unsigned long long)(s.host_frees - before.host_frees),
                    (unsigned long long)s.host_live_bytes, (unsigned long long)s.host_cached_bytes);
            CHECK(s.host_requests - before.host_requests == 1000);
            CHECK(s.host_hits - before.host_hits == 999);
            CHECK(s.host_frees - before.host_frees == 1000);
            CHECK(s.host_live_bytes == 0 && s.host_cached_bytes >= 8 * MB);
            CHECK(s.host_handed_out_bytes - before.host_handed_out_bytes == 1000ull * 8 * MB);
        }
        char *p = malloc(8 * MB);
        free(p);
        struct mallinfo2 m = mallinfo2();
        CHECK(m.hblkhd < 8 * MB); /* nothing of ours in use */
    } else if (!strcmp(mode, "threads")) {
        pthread_t t[8];
        for (long i = 0; i < 8; i++) CHECK(pthread_create(&t[i], NULL, churn, (void *)i) == 0);
        for (int i = 0; i < 8; i++) CHECK(pthread_join(t[i], NULL) == 0);
        if (tm_stats(&s) == 0) CHECK(s.host_requests == 8 * 3000 && s.host_frees == 8 * 3000 && s.host_live_bytes == 0);
    } else if (!strcmp(mode, "crowd") || !strcmp(mode, "generations")) {
        enum { THREADS = 40 };
        pthread_t t[THREADS];
        tm_stats_t before;
        int ours = tm_stats(&before) == 0;
        int at_once = !strcmp(mode, "crowd");
        pairs = 500;
        for (long i = 0; i < THREADS; i++) {
            CHECK(pthread_create(&t[i], NULL, churn, (void *)(i + 1)) == 0);
            if (!at_once) CHECK(pthread_join(t[i], NULL) == 0);
        }
        if (at_once)
            for (int i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
        if (ours) {
            CHECK(tm_stats(&s) == 0);
            fprintf(stderr, "requests %llu frees %llu live %llu\n", (unsigned long long)(s.host_requests - before.host_requests),
                    (unsigned long long)(s.host_frees - before.host_frees), (unsigned long long)s.host_live_bytes);
            CHECK(s.host_requests - before.host_requests == THREADS * 500);
            CHECK(s.host_frees - before.host_frees == THREADS * 500);
            CHECK(s.host_live_bytes == 0);
        }
    } else if (!strcmp(mode, "fork")) {
        char *p = malloc(16 * MB);
        memset(p, 1, 16 * MB);
        free(p);
        pid_t child = fork();
        CHECK(child >= 0);
        char *q = malloc(16 * MB);
        CHECK(q);
        memset(q, child == 0 ? 2 : 3, 16 * MB);
        usleep(100000);
        for (size_t i = 0; i < 16 * MB; i += 4096) CHECK(q[i] == (child == 0 ? 2 : 3));
        free(q);
        if (child == 0) _exit(0);
        int status;
        CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    } else if (!strcmp(mode, "idle")) {
        rss_falls_after(wait_a_while, "600 ms after the free");
    } else if (!strcmp(mode, "mapped")) {
        char *p = malloc(8 * MB);
        CHECK(p);
        memset(p, 1, 8 * MB);
        free(p);
        char *at = (char *)((uintptr_t)p & ~(uintptr_t)4095); /* glibc's chunk starts a header before */
        char *mine = mmap(at, 8 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        CHECK(mine == at);
        memset(mine, 7, 8 * MB);
        for (int i = 0; i < 50; i++) {
            char *q = malloc(8 * MB);
            CHECK(q && (q + 8 * MB <= mine || mine + 8 * MB <= q));
            memset(q, 9, 8 * MB);
            free(q);
        }
        malloc_trim(0);
        for (size_t i = 0; i < 8 * MB; i += 4096) CHECK(mine[i] == 7);
        CHECK(munmap(mine, 8 * MB) == 0);
    } else if (!strcmp(mode, "trim")) {
        rss_falls_after(trim, "after malloc_trim");
    } else {
        CHECK(!"mode");
    }
    puts("ok");
    return 0;
}
