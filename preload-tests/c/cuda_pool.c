/* The CUDA path end to end: the real interposer over the stand-in runtime (fakecudart.c).
 * argv[1] names the scenario; "expect-pool" or "expect-passthrough" in argv[2] says which
 * behaviour the environment should give. */
#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"

int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaSetDevice(int);
int cudaGetLastError(void);
int cudaPeekAtLastError(void);
int cudaMemGetInfo(size_t *, size_t *);
int cudaMallocHost(void **, size_t);
int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);
int cudaDeviceSynchronize(void);
struct fakecuda_counters { uint64_t mallocs, frees, syncs, host_allocs, host_frees; uint64_t used[4]; };
void fakecuda_get_counters(struct fakecuda_counters *);
uint64_t fakecuda_vmm_calls(void);
int fakecuda_launch_memset(void *, int, size_t);

static struct fakecuda_counters counters(void) {
    struct fakecuda_counters c;
    fakecuda_get_counters(&c);
    return c;
}

static int pooled;

static void reuse(void) {
    for (int i = 0; i < 100; i++) {
        void *p = NULL;
        CHECK(cudaMalloc(&p, 64 * MB) == 0 && p);
        CHECK(cudaFree(p) == 0);
    }
    struct fakecuda_counters c = counters();
    CHECK(pooled ? c.mallocs == 1 && c.frees == 0 : c.mallocs == 100 && c.frees == 100);
    tm_stats_t s;
    if (pooled) CHECK(tm_stats(&s) == 0 && s.cuda_requests == 100 && s.cuda_hits == 99);
}

static void oom(void) { /* device memory: 1 GiB */
    void *a = NULL, *b = NULL, *c = (void *)1;
    CHECK(cudaMalloc(&a, 600 * MB) == 0);
    CHECK(cudaFree(a) == 0);
    CHECK(cudaMalloc(&b, 700 * MB) == 0);
    CHECK(cudaGetLastError() == 0); /* a recovered OOM leaves no stale error */
    CHECK(cudaMalloc(&c, 900 * MB) == 2);
    CHECK(cudaGetLastError() == 2); /* a real one is the runtime's own */
    CHECK(cudaFree(b) == 0);
    tm_stats_t s;
    if (pooled) CHECK(tm_stats(&s) == 0 && s.cuda_oom_retries >= 1 && s.cuda_oom_failures >= 1);
}

/* Whatever answers a request, the runtime's last error says the same (under a cap that refuses
 * it, TENSORMALLOC_CUDA_LIMIT, as without one), and reading it clears it. */
static void last_error(void) {
    void *a = NULL;
    int rc = cudaMalloc(&a, 600 * MB);
    CHECK(cudaPeekAtLastError() == rc && cudaGetLastError() == rc && cudaGetLastError() == 0);
    if (rc == 0) CHECK(cudaFree(a) == 0);
    CHECK(cudaMalloc(NULL, MB) == 1 && cudaGetLastError() == 1);
    CHECK(cudaMalloc(&a, 100 * MB) == 0 && cudaFree(a) == 0 && cudaGetLastError() == 0);
}

/* Note [Idle segments]: a training-like loop (the same sizes every step, 1000 steps) makes no
 * driver call after warm-up; then the process idles, and what it held goes back to the driver
 * within TENSORMALLOC_CUDA_RELEASE_MS and a background pass (waited for up to 20 s). */
static void idle(void) {
    for (int step = 0; step < 1000; step++) {
        void *a = NULL, *b = NULL;
        CHECK(cudaMalloc(&a, 600 * MB) == 0 && cudaMalloc(&b, 3 * MB) == 0);
        CHECK(cudaFree(a) == 0 && cudaFree(b) == 0);
        if (step == 0 && pooled) CHECK(counters().frees == 0);
    }
    struct fakecuda_counters c = counters();
    if (pooled) CHECK(c.mallocs == 2 && c.frees == 0);
    CHECK(cudaGetLastError() == 0);
    for (int waited_ms = 0; counters().used[0] >= 600 * MB; waited_ms += 10) {
        CHECK(waited_ms < 20000);
        struct timespec ten = {0, 10 * 1000 * 1000};
        nanosleep(&ten, NULL);
    }
    tm_stats_t s;
    if (pooled) CHECK(tm_stats(&s) == 0 && s.cuda_reserved_bytes == 0);
}

/* Note [Idle segments], pressure: a 200 MiB block freed into the pool, then most of the device
 * taken outside it (managed memory, as another process would take it): the idle segment goes
 * back to the driver within seconds, though the release delay (set long by the test) has not
 * passed. */
int cudaMallocManaged(void **, size_t, unsigned);
static void pressure(void) {
    void *a = NULL, *m = NULL;
    CHECK(cudaMalloc(&a, 200 * MB) == 0 && cudaFree(a) == 0);
    CHECK(cudaMallocManaged(&m, 800 * MB, 1) == 0);
    for (int waited_ms = 0; counters().used[0] >= 1000 * MB; waited_ms += 10) {
        CHECK(waited_ms < 20000);
        struct timespec ten = {0, 10 * 1000 * 1000};
        nanosleep(&ten, NULL);
    }
    tm_stats_t s;
    if (pooled) CHECK(tm_stats(&s) == 0 && s.cuda_reserved_bytes == 0);
    CHECK(cudaFree(m) == 0);
}

/* Two processes on one GPU (the stand-in's FAKECUDA_SHARED_MEM): the holder caches 600 MiB of a
 * 1 GiB device and waits for the pool to give it back; the taker, started once the holder says
 * "cached", takes 350 MiB (the device is now short of memory) and then asks for 500 MiB until
 * the holder's idle segment has gone back to the driver. */
static void neighbour_holder(void) {
    void *a = NULL;
    CHECK(cudaMalloc(&a, 600 * MB) == 0 && cudaFree(a) == 0);
    printf("cached\n");
    fflush(stdout);
    tm_stats_t s;
    for (int waited_ms = 0; pooled && tm_stats(&s) == 0 && s.cuda_reserved_bytes > 0; waited_ms += 10) {
        CHECK(waited_ms < 30000);
        struct timespec ten = {0, 10 * 1000 * 1000};
        nanosleep(&ten, NULL);
    }
}

static void neighbour_taker(void) {
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 350 * MB) == 0);
    for (int waited_ms = 0; cudaMalloc(&b, 500 * MB) != 0; waited_ms += 10) {
        CHECK(waited_ms < 30000);
        CHECK(cudaGetLastError() == 2);
        struct timespec ten = {0, 10 * 1000 * 1000};
        nanosleep(&ten, NULL);
    }
    CHECK(cudaFree(b) == 0 && cudaFree(a) == 0);
}

/* Issue 27's done-when, neighbours: the holder keeps 300 MiB live and 600 MiB cached on a 1 GiB
 * device (12% free: no pressure), says "cached", and waits until its cache has gone back; the
 * taker's first cudaMalloc of 600 MiB succeeds, with no retry of its own: its pool asks the
 * holder's. "stopped": the holder is stopped, so the taker's allocation fails after the bounded
 * wait, with the driver's error. */
static void neighbour_idle_holder(void) {
    void *live = NULL, *a = NULL;
    CHECK(cudaMalloc(&live, 300 * MB) == 0);
    CHECK(cudaMalloc(&a, 600 * MB) == 0 && cudaFree(a) == 0);
    printf("cached\n");
    fflush(stdout);
    tm_stats_t s;
    for (int waited_ms = 0; pooled && tm_stats(&s) == 0 && s.cuda_reserved_bytes > 300 * MB; waited_ms += 10) {
        CHECK(waited_ms < 30000);
        struct timespec ten = {0, 10 * 1000 * 1000};
        nanosleep(&ten, NULL);
    }
    CHECK(cudaFree(live) == 0);
}

static void neighbour_at_once(const char *expect) {
    void *b = NULL;
    int rc = cudaMalloc(&b, 600 * MB);
    if (!strcmp(expect, "fails")) {
        CHECK(rc == 2 && cudaGetLastError() == 2);
        CHECK(cudaMalloc(&b, 600 * MB) == 2 && cudaGetLastError() == 2); /* a neighbour that was silent is not asked again */
        return;
    }
    CHECK(rc == 0);
    CHECK(cudaFree(b) == 0);
}

/* Several processes on one GPU, each allocating and freeing large blocks in a loop while its own
 * pool keeps what it freed (a release delay of a minute): progress comes from asking the others.
 * Every call answers (success or out of memory, with the last error), none hangs; prints how
 * many succeeded. */
static void neighbour_churn(void) {
    unsigned seed = (unsigned)getpid();
    int ok = 0;
    for (int i = 0; i < 100; i++) {
        void *p = NULL;
        size_t size = (100 + rand_r(&seed) % 300) * MB;
        int rc = cudaMalloc(&p, size);
        if (rc == 0) {
            ok++;
            CHECK(cudaFree(p) == 0);
        } else {
            CHECK(rc == 2 && cudaGetLastError() == 2);
        }
    }
    printf("churn %d\n", ok);
}

/* Issue 36, item 4: many neighbours. The holder caches TM_TEST_HOLD_MB (default 30) MiB, says
 * "cached" and waits until its pool gave it back; the taker's first cudaMalloc of TM_TEST_TAKE_MB
 * succeeds, with the memory of all the holders it asked (the test starts 32). */
static void neighbour_many_holder(void) {
    void *a = NULL;
    CHECK(cudaMalloc(&a, env_size("TM_TEST_HOLD_MB", 30) * MB) == 0 && cudaFree(a) == 0);
    printf("cached\n");
    fflush(stdout);
    tm_stats_t s;
    for (int waited_ms = 0; pooled && tm_stats(&s) == 0 && s.cuda_reserved_bytes > 0; waited_ms += 10) {
        CHECK(waited_ms < 60000);
        struct timespec ten = {0, 10 * 1000 * 1000};
        nanosleep(&ten, NULL);
    }
}

static void neighbour_many_taker(void) {
    void *b = NULL;
    CHECK(cudaMalloc(&b, env_size("TM_TEST_TAKE_MB", 900) * MB) == 0);
    CHECK(cudaFree(b) == 0);
}

/* A counter two processes share (the file TM_TEST_COUNTER names): how many asks the asker made. */
static volatile uint64_t *shared_counter(void) {
    const char *path = getenv("TM_TEST_COUNTER");
    CHECK(path);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    CHECK(fd >= 0 && ftruncate(fd, sizeof(uint64_t)) == 0);
    void *m = mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    close(fd);
    return m;
}

/* Issue 36, item 4: a hot loop beside a neighbour that asks without end. The loop (a 600 MB and a
 * 3 MB block a step, as `idle`) runs until the asker made TM_TEST_ASKS (default 30) asks, then
 * checks that its pool made 2 driver allocations and no free all along: no segment it keeps
 * reusing was given back. Prints its steps, wall and CPU nanoseconds (the process's, its threads
 * included) and driver calls; TM_TEST_STEPS: that many steps
 * instead (scripts/bench-neighbours times them). */
/* CPU nanoseconds this process's threads named `name` spent (their utime + stime), or 0. */
static long long threads_cpu_ns(const char *name) {
    long long total = 0, tick = sysconf(_SC_CLK_TCK);
    char path[300], comm[64], line[1024];
    DIR *tasks = opendir("/proc/self/task");
    CHECK(tasks);
    for (struct dirent *e; (e = readdir(tasks));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int named = fgets(comm, sizeof comm, f) && !strncmp(comm, name, strlen(name));
        fclose(f);
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        if (!named || !(f = fopen(path, "r"))) continue;
        unsigned long utime = 0, stime = 0;
        char *p = fgets(line, sizeof line, f) ? strrchr(line, ')') : NULL;
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) == 2)
            total += (long long)(utime + stime) * 1000000000LL / tick;
        fclose(f);
    }
    closedir(tasks);
    return total;
}

static long long ns_between(struct timespec a, struct timespec b) {
    return (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
}

static long long max_ll(long long a, long long b) {
    return a > b ? a : b;
}

/* The most the watchdog thread woke late: how long the process was stopped or starved whole. */
static volatile long long longest_lateness_ns;

static void *watch_lateness(void *arg) {
    (void)arg;
    for (;;) {
        struct timespec before, after, tick = {0, 10 * 1000 * 1000};
        clock_gettime(CLOCK_MONOTONIC, &before);
        nanosleep(&tick, NULL);
        clock_gettime(CLOCK_MONOTONIC, &after);
        longest_lateness_ns = max_ll(longest_lateness_ns, ns_between(before, after) - 10 * 1000 * 1000);
    }
    return NULL;
}

/* The loop could not keep its segments: when it was starved 50 ms or more (its segments idle
 * that long, by the clock), says so and ends well; the test runs it again. */
static void say_if_starved(long long longest_gap_ns) {
    long long starved = max_ll(longest_gap_ns, longest_lateness_ns);
    if (starved >= 50 * 1000 * 1000) {
        printf("starved %lld ms\n", starved / 1000000);
        exit(0);
    }
}

static void hot_loop(void) {
    volatile uint64_t *asks = shared_counter();
    uint64_t want = env_size("TM_TEST_ASKS", 30), steps = 0, failed = 0, fixed = env_size("TM_TEST_STEPS", 0);
    struct timespec t0, t1, c0, c1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    struct fakecuda_counters first = {0};
    uint64_t first_vmm = 0;
    /* The longest the loop's segments may have been idle, from a step's frees to the next
     * step's allocation (or, when that failed, the moment it began), and the longest this
     * process was stopped as a whole (a watchdog thread's lateness): a segment idle 100 ms is a
     * neighbour's by design (Note [Neighbours]), so a loop the machine starved that long may
     * lose it; it says "starved" and the test runs it again. */
    pthread_t watchdog;
    CHECK(fixed || pthread_create(&watchdog, NULL, watch_lateness, NULL) == 0); /* not when timed */
    struct timespec freeing = {0}, now;
    long long longest_gap_ns = 0;
    while (fixed ? steps < fixed : *asks < want || steps < 1000) {
        void *a = NULL, *b = NULL;
        if (steps) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            longest_gap_ns = max_ll(longest_gap_ns, ns_between(freeing, now));
        }
        int ok = cudaMalloc(&a, 600 * 1000 * 1000) == 0;
        if (ok && steps) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            longest_gap_ns = max_ll(longest_gap_ns, ns_between(freeing, now));
        }
        ok = ok && cudaMalloc(&b, 3 * 1000 * 1000) == 0;
        if (!ok && !fixed) say_if_starved(longest_gap_ns);
        CHECK(ok || fixed); /* timed (scripts/bench-neighbours): a failed step is counted */
        if (!ok) failed++, cudaGetLastError();
        clock_gettime(CLOCK_MONOTONIC, &freeing);
        CHECK(cudaFree(a) == 0 && cudaFree(b) == 0);
        if (steps++ == 0) {
            first = counters(), first_vmm = fakecuda_vmm_calls();
            printf("looping\n"); /* its segments exist: the asker may start */
            fflush(stdout);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    struct fakecuda_counters c = counters();
    /* Classic segments: 2 driver allocations in the first step and none after; expandable ones:
     * no virtual memory call after the first step. */
    int kept = c.mallocs == first.mallocs && c.frees == 0 && fakecuda_vmm_calls() == first_vmm && first.mallocs <= 2;
    if (pooled && !fixed && !kept) say_if_starved(longest_gap_ns);
    if (pooled && !fixed) CHECK(kept);
    long long answering = fixed ? threads_cpu_ns("tensormalloc-nb") : 0;
    printf("answering_cpu_ns %lld ", answering);
    printf("steps %llu ns %lld cpu_ns %lld mallocs %llu frees %llu vmm %llu failed %llu\n", (unsigned long long)steps,
           (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec),
           (long long)(c1.tv_sec - c0.tv_sec) * 1000000000LL + (c1.tv_nsec - c0.tv_nsec), (unsigned long long)(c.mallocs - first.mallocs),
           (unsigned long long)c.frees, (unsigned long long)(fakecuda_vmm_calls() - first_vmm), (unsigned long long)failed);
}

/* The neighbour that asks without end: asks for 900 MB (the hot loop holds 603 MB of 1 GiB),
 * fails with out of memory (or, should the loop's memory have come its way, gets it and frees
 * it), counts the ask, and again, until TM_TEST_ASKS asks. */
static void endless_asker(void) {
    volatile uint64_t *asks = shared_counter();
    uint64_t want = env_size("TM_TEST_ASKS", 30);
    while (*asks < want) {
        void *b = NULL;
        int rc = cudaMalloc(&b, 900 * 1000 * 1000);
        CHECK(rc == 0 ? cudaFree(b) == 0 : rc == 2 && cudaGetLastError() == 2);
        __atomic_add_fetch(asks, 1, __ATOMIC_SEQ_CST);
    }
}

/* Issue 36, item 6: the process exits while the background thread gives idle segments back (the
 * test sets the release delay to 0): 64 segments of 12 MiB freed just before main
 * returns. The stand-in driver ends the process with code 86 on a call after its teardown. */
static void exit_busy(void) {
    void *p[64];
    for (int i = 0; i < 64; i++) CHECK(cudaMalloc(&p[i], 12 * MB) == 0);
    for (int i = 0; i < 64; i++) CHECK(cudaFree(p[i]) == 0);
}

static void two_devices(void) {
    void *a = NULL, *b = NULL;
    CHECK(cudaSetDevice(0) == 0 && cudaMalloc(&a, 64 * MB) == 0);
    CHECK(cudaSetDevice(1) == 0 && cudaMalloc(&b, 64 * MB) == 0);
    CHECK(cudaFree(a) == 0); /* device 0's block, freed with device 1 current */
    void *c = NULL;
    CHECK(cudaMalloc(&c, 64 * MB) == 0 && c != a);
    CHECK(cudaSetDevice(0) == 0);
    void *d = NULL;
    CHECK(cudaMalloc(&d, 64 * MB) == 0);
    if (pooled) CHECK(d == a);
    struct fakecuda_counters k = counters();
    CHECK(k.used[0] >= 64 * MB && k.used[1] >= 128 * MB);
}

static void pinned(void) {
    for (int i = 0; i < 20; i++) {
        void *p = NULL;
        CHECK((i % 2 ? cudaMallocHost(&p, 100 * MB) : cudaHostAlloc(&p, 100 * MB, 0)) == 0);
        memset(p, i, 100 * MB);
        CHECK(cudaFreeHost(p) == 0);
    }
    struct fakecuda_counters c = counters();
    CHECK(pooled ? c.host_allocs == 1 : c.host_allocs == 20);
}

static void foreign(void) {
    CHECK(cudaFree((void *)0x12345000) == 1); /* the runtime's error, no crash */
    CHECK(cudaGetLastError() == 1);
    CHECK(cudaFree(NULL) == 0);
    CHECK(cudaFreeHost((void *)0x12345000) == 1);
}

/* A "kernel" still queued on a block when it is freed must finish before anyone reuses it. */
static void safe_reuse(void) {
    for (int i = 0; i < 20; i++) {
        unsigned char *a = NULL;
        CHECK(cudaMalloc((void **)&a, 8 * MB) == 0);
        fakecuda_launch_memset(a, 0x77, 8 * MB);
        CHECK(cudaFree(a) == 0);
        unsigned char *b = NULL;
        CHECK(cudaMalloc((void **)&b, 8 * MB) == 0);
        memset(b, 0x11, 8 * MB); /* the new owner's data */
        CHECK(cudaDeviceSynchronize() == 0);
        CHECK(b[0] == 0x11 && b[8 * MB - 1] == 0x11);
        CHECK(cudaFree(b) == 0);
    }
}

static void meminfo(void) {
    size_t f0, t0, f1, t1;
    CHECK(cudaMemGetInfo(&f0, &t0) == 0);
    void *p = NULL;
    CHECK(cudaMalloc(&p, 256 * MB) == 0);
    CHECK(cudaFree(p) == 0);
    CHECK(cudaMemGetInfo(&f1, &t1) == 0);
    CHECK(t1 == t0 && f1 == f0); /* cached memory counts as free */
    /* A block with a free tail in its segment: under TENSORMALLOC_CUDA_SYNC=reuse its deferred
     * free waits for a synchronization apart from the tail, and the two counted as nothing free
     * (22 MiB short) until our idle synchronization. */
    CHECK(cudaMalloc(&p, 21 * MB) == 0);
    CHECK(cudaFree(p) == 0);
    CHECK(cudaMemGetInfo(&f1, &t1) == 0);
    if (f1 != f0) printf("after a 21 MiB free: %zu MiB free of %zu before\n", f1 / MB, f0 / MB);
    CHECK(f1 == f0);
    /* A small block live in a segment: the rest of that segment can never hold a large block,
     * so it is not counted free, and an allocation of all that is reported free succeeds. */
    void *small = NULL, *q = NULL;
    CHECK(cudaMalloc(&small, 1000) == 0);
    CHECK(cudaMalloc(&p, 100 * MB) == 0 && cudaFree(p) == 0);
    CHECK(cudaMemGetInfo(&f1, &t1) == 0);
    CHECK(f1 <= f0 - 1000);
    CHECK(cudaMalloc(&q, f1) == 0);
    CHECK(cudaFree(q) == 0 && cudaFree(small) == 0);
    CHECK(cudaGetLastError() == 0);
}

/* Note [What the cap leaves] (src/device/pool/cap.rs): under TENSORMALLOC_CUDA_LIMIT too, an
 * allocation of all cudaMemGetInfo reports succeeds: before the first allocation, with a 1 MiB
 * block live, and after its free; and 1 MiB blocks fill what was reported to within a block
 * each (a carved 20 MiB segment the cap refuses gives way to one of their own). */
static void all_reported_is_served(const char *when) {
    size_t f, t;
    void *p = NULL;
    CHECK(cudaMemGetInfo(&f, &t) == 0 && f > 0);
    int rc = cudaMalloc(&p, f);
    if (rc != 0) printf("%s: %zu reported, cudaMalloc of it: %d\n", when, f, rc);
    CHECK(rc == 0 && cudaFree(p) == 0);
}

static void meminfo_capped(void) {
    CHECK(cudaSetDevice(0) == 0);
    all_reported_is_served("before any allocation");
    void *live = NULL;
    CHECK(cudaMalloc(&live, 1 * MB) == 0);
    all_reported_is_served("with 1 MiB live");
    CHECK(cudaFree(live) == 0);
    all_reported_is_served("after its free");
    size_t f, t;
    CHECK(cudaMemGetInfo(&f, &t) == 0);
    static void *blocks[4096];
    size_t n = 0, want = f / (2 * MB);
    while (n < want && n < 4096 && cudaMalloc(&blocks[n], 1 * MB) == 0) n++;
    if (n < want) printf("%zu of %zu 1 MiB blocks in %zu reported\n", n, want, f);
    CHECK(n >= want);
    while (n > 0) CHECK(cudaFree(blocks[--n]) == 0);
    cudaGetLastError();
}

static void pluggable(void) {
    void *(*alloc)(long, int, void *) = (void *(*)(long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_alloc");
    void (*release)(void *, long, int, void *) = (void (*)(void *, long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_free");
    CHECK(alloc && release);
    void *stream = (void *)0x5000;
    void *a = alloc(32 * MB, 0, stream);
    CHECK(a);
    release(a, 32 * MB, 0, stream);
    uint64_t syncs = counters().syncs;
    void *b = alloc(32 * MB, 0, stream);
    CHECK(b == a && counters().syncs == syncs); /* same stream: reused, no synchronization */
    release(b, 32 * MB, 0, stream);
    void *c = alloc(32 * MB, 1, (void *)0x6000); /* another device */
    CHECK(c && c != a);
    release(c, 32 * MB, 1, (void *)0x6000);
}

static void leak(void) {
    void *p = NULL, *q = NULL;
    CHECK(cudaMalloc(&p, 64 * MB) == 0 && cudaMalloc(&q, 1000) == 0);
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    pooled = strcmp(argv[2], "expect-pool") == 0;
    const char *s = argv[1];
    if (!strcmp(s, "reuse")) reuse();
    else if (!strcmp(s, "oom")) oom();
    else if (!strcmp(s, "last-error")) last_error();
    else if (!strcmp(s, "idle")) idle();
    else if (!strcmp(s, "pressure")) pressure();
    else if (!strcmp(s, "neighbour-holder")) neighbour_holder();
    else if (!strcmp(s, "neighbour-taker")) neighbour_taker();
    else if (!strcmp(s, "neighbour-idle-holder")) neighbour_idle_holder();
    else if (!strcmp(s, "neighbour-churn")) neighbour_churn();
    else if (!strcmp(s, "neighbour-at-once")) neighbour_at_once("succeeds");
    else if (!strcmp(s, "neighbour-stopped")) neighbour_at_once("fails");
    else if (!strcmp(s, "exit-busy")) exit_busy();
    else if (!strcmp(s, "neighbour-many-holder")) neighbour_many_holder();
    else if (!strcmp(s, "neighbour-many-taker")) neighbour_many_taker();
    else if (!strcmp(s, "hot-loop")) hot_loop();
    else if (!strcmp(s, "endless-asker")) endless_asker();
    else if (!strcmp(s, "two-devices")) two_devices();
    else if (!strcmp(s, "pinned")) pinned();
    else if (!strcmp(s, "foreign")) foreign();
    else if (!strcmp(s, "safe-reuse")) safe_reuse();
    else if (!strcmp(s, "meminfo")) meminfo();
    else if (!strcmp(s, "meminfo-capped")) meminfo_capped();
    else if (!strcmp(s, "pluggable")) pluggable();
    else if (!strcmp(s, "leak")) leak();
    else CHECK(!"unknown scenario");
    printf("%s ok\n", s);
    return 0;
}
