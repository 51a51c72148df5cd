/* Expandable segments (issue 28) end to end: the library over the stand-in driver's virtual
 * memory API (c/fakecuda.c, a simulator), beside the driver alone. argv[1] names the scenario;
 * argv[2] is "expect-expandable" (TENSORMALLOC_CUDA_SEGMENTS=expandable under the preload),
 * "expect-classic" (the preload, classic segments) or "expect-driver" (no preload).
 *   checkerboard  400 blocks of 2 MiB, every other one freed, then 500 MiB on a 1 GiB device:
 *                 the driver alone and expandable segments serve it; classic segments cannot
 *   random        a long random sequence of sizes (512 B to 64 MiB) and frees; prints the
 *                 pool's peak reserved and peak live bytes (the test compares them)
 *   idle          a small block and a 10 MiB one stay live around 300 MiB freed: within the
 *                 release delay, the driver has those 300 MiB back
 *   ipc           an IPC handle of a block: one of ours under expandable segments (test_cuda_ipc.py
 *                 opens them), the driver's own without us
 *   threads       8 threads allocate, write, check and free at random; after tm_trim the
 *                 driver holds nothing for us
 *   queued        blocks freed while a "kernel" on them is still queued (cudaFreeAsync, and
 *                 cudaFree under TENSORMALLOC_CUDA_SYNC=reuse): their chunks are neither
 *                 unmapped nor moved before the work ran (the stand-in aborts on a kernel
 *                 whose memory went), by the background thread, a new block or tm_trim
 *   peer          device 1's blocks in device 0's kernels: refused before cudaDeviceEnablePeerAccess
 *                 (illegal address, as the driver refuses), working after it, for blocks made
 *                 before and after; and device 0's blocks stay out of device 1's kernels
 *   loop          a training-like loop (1,000 steps of a 600 MB, a 3 MB and a 100-byte block)
 *                 makes no virtual memory call after its first step, on a 700 MB device where
 *                 the pressure path is on all along; its chunks go back once it idles */
#include <pthread.h>
#include <string.h>
#include <time.h>
#include "check.h"
#include "standin.h"

typedef struct { char reserved[64]; } CUipcMemHandle;
int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaSetDevice(int);
int cudaGetLastError(void);
int cudaMemGetInfo(size_t *, size_t *);
int cudaIpcGetMemHandle(CUipcMemHandle *, void *);
int cudaFreeAsync(void *, void *);
int cudaDeviceEnablePeerAccess(int, unsigned);

struct fakecuda_counters { uint64_t mallocs, frees, syncs, host_allocs, host_frees; uint64_t used[4]; };
void fakecuda_get_counters(struct fakecuda_counters *);
uint64_t fakecuda_vmm_calls(void);

static const char *expect;
static int is(const char *e) { return !strcmp(expect, e); }

static size_t device_used(void) {
    size_t free_b = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_b, &total) == 0);
    return total - free_b;
}

static size_t (*trim)(void);

static void checkerboard(void) {
    /* Classic segments carve 1.5 MiB requests from 20 MiB segments (2 MiB ones get their own,
     * which the checkerboard would not fragment). */
    const size_t size = is("expect-classic") ? 3 * MB / 2 : 2 * MB;
    void *blocks[400];
    for (int i = 0; i < 400; i++) CHECK(cudaMalloc(&blocks[i], size) == 0);
    for (int i = 0; i < 400; i += 2) CHECK(cudaFree(blocks[i]) == 0);
    for (int i = 1; i < 400; i += 2) kernel_works(blocks[i], size, i & 0xff);
    void *big = NULL;
    int rc = cudaMalloc(&big, 500 * MB);
    if (is("expect-classic")) {
        CHECK(rc == 2 && cudaGetLastError() == 2);
    } else {
        CHECK(rc == 0);
        kernel_works(big, 500 * MB, 0x3c);
        for (int i = 1; i < 400; i += 2) CHECK(holds(blocks[i], size, i & 0xff));
        CHECK(cudaFree(big) == 0);
    }
    for (int i = 1; i < 400; i += 2) CHECK(cudaFree(blocks[i]) == 0);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void random_sizes(void) {
    void *live[64];
    int n = 0;
    for (int step = 0; step < 20000; step++) {
        if (n < 40 && (n == 0 || next_random() % 3 != 0)) {
            int bits = 9 + (int)(next_random() % 18);
            size_t size = ((size_t)1 << bits) + (size_t)(next_random() % ((uint64_t)1 << bits));
            if (size > 64 * MB) size = 64 * MB;
            CHECK(cudaMalloc(&live[n], size) == 0);
            n++;
        } else {
            int i = (int)(next_random() % (uint64_t)n);
            CHECK(cudaFree(live[i]) == 0);
            live[i] = live[--n];
        }
    }
    while (n > 0) CHECK(cudaFree(live[--n]) == 0);
}

static void idle(void) {
    void *small = NULL, *mid = NULL, *big = NULL;
    size_t before = device_used();
    CHECK(cudaMalloc(&small, 100) == 0 && cudaMalloc(&big, 300 * MB) == 0 && cudaMalloc(&mid, 10 * MB) == 0);
    CHECK(cudaFree(big) == 0);
    /* cudaMemGetInfo counts our idle chunks as free: the driver's own figure is the stand-in's. */
    struct fakecuda_counters c;
    int waited_ms = 0;
    for (;; waited_ms += 10) {
        fakecuda_get_counters(&c);
        if (c.used[0] <= before + 16 * MB) break;
        CHECK(waited_ms < 5000);
        struct timespec ten = {0, 10 * 1000 * 1000};
        nanosleep(&ten, NULL);
    }
    kernel_works(small, 100, 0x11);
    kernel_works(mid, 10 * MB, 0x22);
    CHECK(cudaFree(small) == 0 && cudaFree(mid) == 0);
}

static void ipc(void) {
    void *a = NULL;
    CUipcMemHandle h;
    CHECK(cudaMalloc(&a, 4 * MB) == 0);
    int rc = cudaIpcGetMemHandle(&h, a);
    CHECK(rc == 0 && cudaGetLastError() == 0);
    /* Expandable: a handle of ours ("tmIPCv1"), which a process under the preload opens. */
    CHECK(!memcmp(h.reserved, "tmIPCv1", 8) == is("expect-expandable"));
    CHECK(cudaFree(a) == 0);
}

static void *thread_main(void *arg) {
    uint64_t r = 0x1234567 + (uintptr_t)arg * 7919;
    void *live[16];
    size_t sizes[16];
    int values[16], n = 0;
    CHECK(cudaSetDevice(0) == 0);
    for (int step = 0; step < 400; step++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        if (n < 16 && (n == 0 || r % 2)) {
            sizes[n] = 512 + (size_t)(r % (6 * MB));
            values[n] = (int)((uintptr_t)arg * 16 + step) & 0xff;
            CHECK(cudaMalloc(&live[n], sizes[n]) == 0);
            CHECK(fakecuda_launch_memset(live[n], values[n], sizes[n]) == 0);
            n++;
        } else {
            int i = (int)(r % (uint64_t)n);
            CHECK(cudaDeviceSynchronize() == 0);
            CHECK(holds(live[i], sizes[i], values[i]));
            CHECK(cudaFree(live[i]) == 0);
            live[i] = live[n - 1], sizes[i] = sizes[n - 1], values[i] = values[n - 1];
            n--;
        }
    }
    CHECK(cudaDeviceSynchronize() == 0);
    while (n > 0) {
        n--;
        CHECK(holds(live[n], sizes[n], values[n]));
        CHECK(cudaFree(live[n]) == 0);
    }
    return NULL;
}

static void threads(void) {
    CHECK(cudaSetDevice(0) == 0);
    size_t before = device_used();
    pthread_t t[8];
    for (long i = 0; i < 8; i++) CHECK(pthread_create(&t[i], NULL, thread_main, (void *)i) == 0);
    for (int i = 0; i < 8; i++) CHECK(pthread_join(t[i], NULL) == 0);
    if (trim) trim();
    struct fakecuda_counters c;
    fakecuda_get_counters(&c);
    CHECK(c.used[0] == before);
}

static void queued(void) {
    for (int round = 0; round < 20; round++) {
        void *a = NULL, *b = NULL, *big = NULL;
        CHECK(cudaMalloc(&a, 64 * MB) == 0);
        CHECK(fakecuda_launch_memset(a, 0x5a, 64 * MB) == 0);
        CHECK((round % 2 ? cudaFree(a) : cudaFreeAsync(a, NULL)) == 0);
        struct timespec t = {0, 20 * 1000 * 1000};
        nanosleep(&t, NULL); /* the background thread's pass, release delay 0 */
        /* New blocks elsewhere, past the budget: idle chunks would be moved here. */
        CHECK(cudaMalloc(&big, 300 * MB) == 0 && cudaMalloc(&b, 64 * MB) == 0);
        CHECK(cudaFree(big) == 0);
        CHECK(cudaDeviceSynchronize() == 0);
        CHECK(cudaFree(b) == 0);
    }
    if (trim) trim();
}

static void peer(void) {
    void *before = NULL, *after = NULL, *own = NULL;
    CHECK(cudaSetDevice(1) == 0 && cudaMalloc(&before, 5 * MB) == 0);
    kernel_works(before, 5 * MB, 0x21);
    CHECK(cudaSetDevice(0) == 0 && cudaMalloc(&own, 3 * MB) == 0);
    CHECK(fakecuda_launch_memset(before, 0x22, 5 * MB) == 700); /* no peer access yet */
    CHECK(cudaDeviceEnablePeerAccess(1, 0) == 0);
    kernel_works(before, 5 * MB, 0x23);
    CHECK(cudaSetDevice(1) == 0 && cudaMalloc(&after, 7 * MB) == 0);
    CHECK(fakecuda_launch_memset(own, 0x24, 3 * MB) == 700); /* access is one way */
    CHECK(cudaSetDevice(0) == 0);
    kernel_works(after, 7 * MB, 0x25);
    CHECK(cudaFree(before) == 0 && cudaFree(after) == 0 && cudaFree(own) == 0);
}

static void loop(void) {
    uint64_t after_warmup = 0;
    for (int step = 0; step < 1000; step++) {
        void *a = NULL, *b = NULL, *c = NULL;
        CHECK(cudaMalloc(&a, 600 * 1000 * 1000) == 0 && cudaMalloc(&b, 3 * 1000 * 1000) == 0 && cudaMalloc(&c, 100) == 0);
        CHECK(cudaFree(a) == 0 && cudaFree(b) == 0 && cudaFree(c) == 0);
        if (step == 0) after_warmup = fakecuda_vmm_calls();
    }
    CHECK(fakecuda_vmm_calls() == after_warmup);
    if (is("expect-expandable")) {
        /* Idle now: its chunks go back (the pressure path: within seconds). */
        struct fakecuda_counters c;
        for (int waited_ms = 0;; waited_ms += 10) {
            fakecuda_get_counters(&c);
            if (c.used[0] == 0) break;
            CHECK(waited_ms < 10000);
            struct timespec ten = {0, 10 * 1000 * 1000};
            nanosleep(&ten, NULL);
        }
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    expect = argv[2];
    trim = (size_t (*)(void))dlsym(RTLD_DEFAULT, "tm_trim");
    CHECK(cudaSetDevice(0) == 0);
    const char *s = argv[1];
    if (!strcmp(s, "checkerboard")) checkerboard();
    else if (!strcmp(s, "random")) random_sizes();
    else if (!strcmp(s, "idle")) idle();
    else if (!strcmp(s, "ipc")) ipc();
    else if (!strcmp(s, "threads")) threads();
    else if (!strcmp(s, "loop")) loop();
    else if (!strcmp(s, "queued")) queued();
    else if (!strcmp(s, "peer")) peer();
    else CHECK(!"unknown scenario");
    printf("%s ok\n", s);
    return 0;
}
