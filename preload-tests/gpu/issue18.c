/* Issue 18's scenarios that a real GPU can run, for scripts/gpu-check: plain host code over the
 * driver and runtime APIs (no kernels: cuMemsetD8 is the work, cuMemcpyDtoH reads it back). Built
 * with nvcc against the real CUDA; built with -DSTANDIN over the project's simulators
 * (preload-tests/c/fakecuda.c, fakecudart.c), whose memset "kernel" refuses memory of a dead or
 * another context, so preload-tests/test_cuda_gpu_program.py proves the logic without a GPU.
 * argv[1] names the scenario; each passes without tensormalloc and prints one JSON line
 * {"scenario", "failures", "checks", "ms", ...}; the exit status is 1 when a check failed:
 *   release        the primary context released to zero (numba.cuda.close()) and retained again:
 *                  device and pinned blocks allocated after it all work in the new context
 *   two-contexts   a thread in the primary context and one in a cuCtxCreate context make their
 *                  first allocations at once: every block belongs to its thread's context
 *   double-free    cudaFree, cuMemFree_v2 and cuMemFreeHost twice: the second answers invalid
 *                  value (cuMemFreeHost: an error) and frees nothing; the live neighbour works
 *   threads        32 threads make the process's first CUDA calls at once (half through the
 *                  runtime, half through the driver): every call succeeds */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef STANDIN
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef int cudaError_t;
#define CUDA_VERSION 12000
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define cudaSuccess 0
#define cudaErrorInvalidValue 1
#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuCtxCreate cuCtxCreate_v2
#define cuCtxDestroy cuCtxDestroy_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemAllocHost cuMemAllocHost_v2
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuDevicePrimaryCtxGetState(CUdevice, unsigned *, int *);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemFreeHost(void *);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaGetLastError(void);
int fakecuda_launch_memset(void *, int, size_t);
int fakecuda_read_byte(const void *, unsigned char *);
#else
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

static int failures, checks;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        __atomic_add_fetch(&checks, 1, __ATOMIC_RELAXED);                                  \
        if (!(cond)) {                                                                     \
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                            \
            fprintf(stderr, "CHECK failed %s:%d: %s\n", __FILE__, __LINE__, #cond);        \
        }                                                                                  \
    } while (0)

#define MB (1024UL * 1024UL)

/* The work: fill [d, d+n) with value in the current context and wait for it. */
static int fill(CUdeviceptr d, size_t n, int value) {
#ifdef STANDIN
    if (fakecuda_launch_memset((void *)(uintptr_t)d, value, n) != 0) return 0;
#else
    if (cuMemsetD8(d, (unsigned char)value, n) != CUDA_SUCCESS) return 0;
#endif
    return cuCtxSynchronize() == CUDA_SUCCESS;
}

static int byte_at(CUdeviceptr d, unsigned char *out) {
#ifdef STANDIN
    return fakecuda_read_byte((const void *)(uintptr_t)d, out) == 0;
#else
    return cuMemcpyDtoH(out, d, 1) == CUDA_SUCCESS;
#endif
}

/* The block holds value at its first, middle and last byte. */
static int holds(CUdeviceptr d, size_t n, int value) {
    unsigned char a = 0, b = 0, c = 0;
    return byte_at(d, &a) && byte_at(d + n / 2, &b) && byte_at(d + n - 1, &c) && a == value && b == value && c == value;
}

/* The block works in the current context: written and read back. */
static int works(CUdeviceptr d, size_t n, int value) {
    return fill(d, n, value) && holds(d, n, value);
}

/* The driver's context for the block (what the pool must never get wrong). */
static CUcontext owner(CUdeviceptr d) {
    CUcontext ctx = NULL;
    return cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, d) == CUDA_SUCCESS ? ctx : NULL;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static CUdevice device0(void) {
    CUdevice dev = 0;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    return dev;
}

static int primary_active(CUdevice dev) {
    unsigned flags = 0;
    int active = -1;
    return cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS ? active : -1;
}

/* ---------- release: numba.cuda.close() then new work ---------- */

static const size_t SIZES[] = {1 * MB, 3 * MB, 8 * MB, 24 * MB};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

/* One round in the current context: device blocks of every size and a pinned block, each used,
 * then freed (so the pool caches them). */
static void round_of_work(CUcontext ctx, int value) {
    CUdeviceptr d[NSIZES] = {0};
    for (size_t i = 0; i < NSIZES; i++) {
        CHECK(cuMemAlloc(&d[i], SIZES[i]) == CUDA_SUCCESS && d[i]);
        if (!d[i]) continue;
        CHECK(owner(d[i]) == ctx);
        CHECK(works(d[i], SIZES[i], value + (int)i));
    }
    void *pinned = NULL;
    CHECK(cuMemAllocHost(&pinned, 2 * MB) == CUDA_SUCCESS && pinned);
    if (pinned) {
        memset(pinned, value, 2 * MB); /* a pinned block of a dead context would fault here */
        CHECK(((unsigned char *)pinned)[2 * MB - 1] == (unsigned char)value);
        CHECK(cuMemFreeHost(pinned) == CUDA_SUCCESS);
    }
    for (size_t i = 0; i < NSIZES; i++)
        if (d[i]) CHECK(cuMemFree(d[i]) == CUDA_SUCCESS);
}

static void release(void) {
    CUdevice dev = device0();
    int rounds = 3, released_to_zero = 0;
    for (int r = 0; r < rounds; r++) {
        CUcontext ctx = NULL;
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && ctx);
        CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
        round_of_work(ctx, 0x10 * (r + 1));
        round_of_work(ctx, 0x10 * (r + 1) + 8); /* reuses what the first round cached */
        CHECK(cuCtxSetCurrent(NULL) == CUDA_SUCCESS);
        CHECK(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
        int active = primary_active(dev);
        CHECK(active == 0); /* released to zero: every allocation in it is gone */
        released_to_zero += active == 0;
    }
    printf("{\"scenario\": \"release\", \"rounds\": %d, \"released_to_zero\": %d, ", rounds, released_to_zero);
}

/* ---------- two-contexts: first allocations racing in two contexts of one device ---------- */

struct racer {
    CUcontext ctx;
    pthread_barrier_t *start;
    int value, wrong_context, failed_work;
};

static void *race_in(void *arg) {
    struct racer *r = (struct racer *)arg;
    CHECK(cuCtxSetCurrent(r->ctx) == CUDA_SUCCESS);
    pthread_barrier_wait(r->start);
    enum { LIVE = 8, STEPS = 40 };
    CUdeviceptr live[LIVE] = {0};
    for (int i = 0; i < STEPS; i++) {
        size_t n = SIZES[i % NSIZES] / 2 + (size_t)i * 4096;
        CUdeviceptr *slot = &live[i % LIVE];
        if (*slot) CHECK(cuMemFree(*slot) == CUDA_SUCCESS);
        *slot = 0;
        CHECK(cuMemAlloc(slot, n) == CUDA_SUCCESS && *slot);
        if (!*slot) continue;
        if (owner(*slot) != r->ctx) r->wrong_context++;
        if (!works(*slot, n, r->value)) r->failed_work++;
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i]) CHECK(cuMemFree(live[i]) == CUDA_SUCCESS);
    CHECK(r->wrong_context == 0);
    CHECK(r->failed_work == 0);
    return NULL;
}

static void two_contexts(void) {
    CUdevice dev = device0();
    CUcontext primary = NULL, created = NULL;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS && primary);
#if CUDA_VERSION >= 13000
    CHECK(cuCtxCreate(&created, NULL, 0, dev) == CUDA_SUCCESS && created);
#else
    CHECK(cuCtxCreate(&created, 0, dev) == CUDA_SUCCESS && created);
#endif
    CHECK(created != primary);
    CHECK(cuCtxSetCurrent(NULL) == CUDA_SUCCESS);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    struct racer r[2] = {{primary, &start, 0x5a, 0, 0}, {created, &start, 0xa5, 0, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, race_in, &r[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
    CHECK(cuCtxDestroy(created) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
    printf("{\"scenario\": \"two-contexts\", \"wrong_context\": [%d, %d], \"failed_work\": [%d, %d], ", r[0].wrong_context,
           r[1].wrong_context, r[0].failed_work, r[1].failed_work);
}

/* ---------- double-free: the driver's answer, nothing freed ---------- */

static void double_free(void) {
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 1 * MB) == cudaSuccess && a);
    CHECK(cudaMalloc(&b, 1 * MB) == cudaSuccess && b); /* in the pool, a neighbour of a */
    CUdeviceptr db = (CUdeviceptr)(uintptr_t)b;
    CHECK(works(db, 1 * MB, 0x33));
    CHECK(cudaFree(a) == cudaSuccess);
    int runtime_second = (int)cudaFree(a);
    CHECK(runtime_second == cudaErrorInvalidValue);
    cudaGetLastError(); /* the error just made is not the program's next call's */
    CHECK(holds(db, 1 * MB, 0x33));
    CHECK(works(db, 1 * MB, 0x44));

    CUdeviceptr c = 0, d = 0;
    CHECK(cuMemAlloc(&c, 1 * MB) == CUDA_SUCCESS && c);
    CHECK(cuMemAlloc(&d, 1 * MB) == CUDA_SUCCESS && d);
    CHECK(works(d, 1 * MB, 0x55));
    CHECK(cuMemFree(c) == CUDA_SUCCESS);
    int driver_second = (int)cuMemFree(c);
    CHECK(driver_second == CUDA_ERROR_INVALID_VALUE);
    CHECK(holds(d, 1 * MB, 0x55) && holds(db, 1 * MB, 0x44));
    /* New blocks never land on the live ones. */
    CUdeviceptr e = 0;
    CHECK(cuMemAlloc(&e, 1 * MB) == CUDA_SUCCESS && e && e != d && e != db);
    CHECK(works(e, 1 * MB, 0x66) && holds(d, 1 * MB, 0x55) && holds(db, 1 * MB, 0x44));

    void *p = NULL, *q = NULL;
    CHECK(cuMemAllocHost(&p, 1 * MB) == CUDA_SUCCESS && p);
    CHECK(cuMemAllocHost(&q, 1 * MB) == CUDA_SUCCESS && q);
    if (q) memset(q, 0x77, 1 * MB);
    CHECK(cuMemFreeHost(p) == CUDA_SUCCESS);
    int pinned_second = (int)cuMemFreeHost(p);
    CHECK(pinned_second != CUDA_SUCCESS);
    if (q) {
        memset(q, 0x78, 1 * MB); /* still mapped: an unmapped neighbour would fault here */
        CHECK(((unsigned char *)q)[1 * MB - 1] == 0x78);
        CHECK(cuMemFreeHost(q) == CUDA_SUCCESS);
    }
    if (e) CHECK(cuMemFree(e) == CUDA_SUCCESS);
    if (d) CHECK(cuMemFree(d) == CUDA_SUCCESS);
    if (b) CHECK(cudaFree(b) == cudaSuccess);
    printf("{\"scenario\": \"double-free\", \"cudaFree_twice\": %d, \"cuMemFree_twice\": %d, \"cuMemFreeHost_twice\": %d, ",
           runtime_second, driver_second, pinned_second);
}

/* ---------- threads: 32 first CUDA calls at once ---------- */

enum { THREADS = 32 };
static pthread_barrier_t go;
static int first_rc[THREADS];

static void *first_call(void *arg) {
    int i = (int)(intptr_t)arg;
    pthread_barrier_wait(&go);
    size_t n = MB + (size_t)i * 65536;
    if (i % 2 == 0) { /* the runtime: its first call binds the primary context */
        void *p = NULL;
        first_rc[i] = (int)cudaMalloc(&p, n);
        if (first_rc[i] != cudaSuccess || !p) return NULL;
        CHECK(works((CUdeviceptr)(uintptr_t)p, n, i));
        CHECK(cudaFree(p) == cudaSuccess);
    } else { /* the driver: cuInit, then the primary context by hand */
        CUcontext ctx = NULL;
        CUdevice dev = 0;
        CUdeviceptr d = 0;
        first_rc[i] = (int)cuInit(0);
        if (first_rc[i] != CUDA_SUCCESS) return NULL;
        CHECK(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && ctx);
        CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
        first_rc[i] = (int)cuMemAlloc(&d, n);
        if (first_rc[i] != CUDA_SUCCESS || !d) return NULL;
        CHECK(works(d, n, i));
        CHECK(cuMemFree(d) == CUDA_SUCCESS);
        CHECK(cuCtxSetCurrent(NULL) == CUDA_SUCCESS);
        CHECK(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
    }
    return NULL;
}

static void threads(void) {
    pthread_t t[THREADS];
    pthread_barrier_init(&go, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, first_call, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&go);
    int failed = 0;
    for (int i = 0; i < THREADS; i++) {
        CHECK(first_rc[i] == 0);
        failed += first_rc[i] != 0;
    }
    printf("{\"scenario\": \"threads\", \"threads\": %d, \"first_calls_failed\": %d, ", THREADS, failed);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s release|two-contexts|double-free|threads\n", argv[0]);
        return 2;
    }
    double t0 = now_ms();
    const char *s = argv[1];
    if (!strcmp(s, "release")) release();
    else if (!strcmp(s, "two-contexts")) two_contexts();
    else if (!strcmp(s, "double-free")) double_free();
    else if (!strcmp(s, "threads")) threads();
    else {
        fprintf(stderr, "unknown scenario %s\n", s);
        return 2;
    }
    printf("\"failures\": %d, \"checks\": %d, \"ms\": %.1f}\n", failures, checks, now_ms() - t0);
    return failures != 0;
}
