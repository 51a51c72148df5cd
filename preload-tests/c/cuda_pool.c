/* The CUDA path end to end: the real interposer over the stand-in runtime (fakecudart.c).
 * argv[1] names the scenario; "expect-pool" or "expect-passthrough" in argv[2] says which
 * behaviour the environment should give. */
#include <stdlib.h>
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
    else if (!strcmp(s, "two-devices")) two_devices();
    else if (!strcmp(s, "pinned")) pinned();
    else if (!strcmp(s, "foreign")) foreign();
    else if (!strcmp(s, "safe-reuse")) safe_reuse();
    else if (!strcmp(s, "meminfo")) meminfo();
    else if (!strcmp(s, "pluggable")) pluggable();
    else if (!strcmp(s, "leak")) leak();
    else CHECK(!"unknown scenario");
    printf("%s ok\n", s);
    return 0;
}
