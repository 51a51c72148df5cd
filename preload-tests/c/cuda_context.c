/* Issue 18: context identity and lifetime under a pool, over the simulators (fakecuda.c). argv[1]
 * names the scenario; each prints "SCENARIO ok" and passes without tensormalloc:
 *   release, release-v1,         the primary context released to zero (cuDevicePrimaryCtxRelease_v2,
 *   release-proc, release-dlsym  cuDevicePrimaryCtxRelease, the entry point cuGetProcAddress_v2 or
 *                                dlsym gives) and retained again, with the same handle: blocks
 *                                cached from the dead context (device and pinned) are never
 *                                handed out again; a block live across it is the driver's to answer
 *   release-shared               a release that leaves a reference: nothing dies, all still usable
 *   destroy-reuse                a cuCtxCreate context destroyed and a new one given its handle
 *                                (FAKECUDA_REUSE_CONTEXTS=1): nothing of the old one comes back
 *   race                         a thread in the primary context and one in a cuCtxCreate context
 *                                make their first allocations at once, cuMemAlloc slow
 *                                (FAKECUDA_ALLOC_DELAY_US): each only ever gets blocks it can use */
#include <pthread.h>
#include "check.h"
#include "standin.h"

typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;

int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuDevicePrimaryCtxRelease_v2(int);
int cuDevicePrimaryCtxRelease(int);
int cuDevicePrimaryCtxGetState(int, unsigned *, int *);
int cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
int cuCtxCreate_v2(CUcontext *, unsigned, int);
int cuCtxDestroy_v2(CUcontext);
int cuCtxSetCurrent(CUcontext);
int cuCtxSynchronize(void);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemAllocHost_v2(void **, size_t);
int cuMemFreeHost(void *);

#define PTR(d) ((void *)(uintptr_t)(d))

/* A "kernel" over the block in the current context: refused for a block of a dead context or of
 * another context. */
static void driver_kernel_works(CUdeviceptr d, size_t n, int value) {
    CHECK(fakecuda_launch_memset(PTR(d), value, n) == 0);
    CHECK(cuCtxSynchronize() == 0);
    CHECK(holds(PTR(d), n, value));
}

static CUcontext primary_current(void) {
    CUcontext ctx = NULL;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == 0 && ctx);
    CHECK(cuCtxSetCurrent(ctx) == 0);
    return ctx;
}

static int primary_active(void) {
    unsigned flags = 0;
    int active = -1;
    CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active) == 0);
    return active;
}

/* Cached and live device blocks of two sizes (a shared segment and one of its own), and a cached
 * pinned block. */
struct blocks { CUdeviceptr live; };

static struct blocks fill_caches(void) {
    CUdeviceptr a = 0, b = 0, live = 0;
    CHECK(cuMemAlloc_v2(&a, 1 * MB) == 0 && cuMemAlloc_v2(&live, 1 * MB) == 0 && cuMemAlloc_v2(&b, 64 * MB) == 0);
    driver_kernel_works(a, 1 * MB, 0x11);
    driver_kernel_works(b, 64 * MB, 0x12);
    driver_kernel_works(live, 1 * MB, 0x13);
    CHECK(cuMemFree_v2(a) == 0 && cuMemFree_v2(b) == 0);
    void *h = NULL;
    CHECK(cuMemAllocHost_v2(&h, 1 * MB) == 0);
    memset(h, 0x14, 1 * MB);
    CHECK(cuMemFreeHost(h) == 0);
    return (struct blocks){live};
}

/* What a new life of the context gets is memory it can use. */
static void fresh_blocks_work(void) {
    CUdeviceptr d[4] = {0};
    size_t sizes[4] = {1 * MB, 1 * MB, 64 * MB, 512 * 1024};
    for (int i = 0; i < 4; i++) {
        CHECK(cuMemAlloc_v2(&d[i], sizes[i]) == 0);
        driver_kernel_works(d[i], sizes[i], 0x21 + i);
    }
    for (int i = 0; i < 4; i++) CHECK(cuMemFree_v2(d[i]) == 0);
    void *h = NULL;
    CHECK(cuMemAllocHost_v2(&h, 1 * MB) == 0);
    memset(h, 0x25, 1 * MB); /* a pinned block of the dead context faults here */
    CHECK(cuMemFreeHost(h) == 0);
}

enum { BY_SYMBOL, BY_V1, BY_PROC, BY_DLSYM };

static void release(int by) {
    CHECK(cuInit(0) == 0);
    CUcontext first = primary_current();
    struct blocks k = fill_caches();
    int (*rel)(int) = cuDevicePrimaryCtxRelease_v2;
    if (by == BY_V1) rel = cuDevicePrimaryCtxRelease;
    if (by == BY_PROC) {
        void *fn = NULL;
        int status = -1;
        CHECK(cuGetProcAddress_v2("cuDevicePrimaryCtxRelease", &fn, 12000, 0, &status) == 0 && fn && status == 0);
        rel = (int (*)(int))fn;
    }
    if (by == BY_DLSYM) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        CHECK(lib);
        rel = (int (*)(int))dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
        CHECK(rel);
    }
    CHECK(rel(0) == 0);
    CHECK(primary_active() == 0);
    CHECK(cuCtxSetCurrent(NULL) == 0);
    CUcontext again = primary_current();
    CHECK(again == first); /* the primary context keeps its handle, as NVIDIA's does */
    CHECK(primary_active() == 1);
    fresh_blocks_work();
    CHECK(cuMemFree_v2(k.live) != 0); /* it died with its context: the driver's answer */
    fresh_blocks_work();
    CHECK(cuDevicePrimaryCtxRelease_v2(0) == 0);
}

static void release_shared(void) {
    CHECK(cuInit(0) == 0);
    CUcontext ctx = primary_current();
    CUcontext other = NULL;
    CHECK(cuDevicePrimaryCtxRetain(&other, 0) == 0 && other == ctx);
    struct blocks k = fill_caches();
    CHECK(cuDevicePrimaryCtxRelease_v2(0) == 0);
    CHECK(primary_active() == 1);
    driver_kernel_works(k.live, 1 * MB, 0x31);
    fresh_blocks_work();
    CHECK(cuMemFree_v2(k.live) == 0);
    CHECK(cuDevicePrimaryCtxRelease_v2(0) == 0);
}

static void destroy_reuse(void) {
    CHECK(cuInit(0) == 0);
    CUcontext first = NULL, second = NULL;
    CHECK(cuCtxCreate_v2(&first, 0, 0) == 0);
    struct blocks k = fill_caches();
    CHECK(cuCtxDestroy_v2(first) == 0);
    CHECK(cuCtxCreate_v2(&second, 0, 0) == 0);
    CHECK(second == first); /* FAKECUDA_REUSE_CONTEXTS=1 */
    fresh_blocks_work();
    CHECK(cuMemFree_v2(k.live) != 0);
    CHECK(cuCtxDestroy_v2(second) == 0);
}

static pthread_barrier_t start;

/* Rounds of three live 8 MiB blocks, each used by a kernel in this thread's context: more than
 * one 20 MiB segment holds, so a pool holding both contexts' segments hands one of them out. */
static void *racer(void *arg) {
    CUcontext ctx = NULL;
    if (arg) ctx = primary_current();
    else CHECK(cuCtxCreate_v2(&ctx, 0, 0) == 0);
    pthread_barrier_wait(&start);
    for (int round = 0; round < 8; round++) {
        CUdeviceptr d[3] = {0};
        for (int i = 0; i < 3; i++) {
            CHECK(cuMemAlloc_v2(&d[i], 8 * MB) == 0);
            driver_kernel_works(d[i], 8 * MB, 0x40 + i);
        }
        for (int i = 0; i < 3; i++) CHECK(cuMemFree_v2(d[i]) == 0);
    }
    if (!arg) CHECK(cuCtxDestroy_v2(ctx) == 0);
    return NULL;
}

static void race(void) {
    CHECK(cuInit(0) == 0);
    pthread_t t[2];
    pthread_barrier_init(&start, NULL, 2);
    CHECK(pthread_create(&t[0], NULL, racer, (void *)1) == 0);
    CHECK(pthread_create(&t[1], NULL, racer, NULL) == 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    const char *s = argv[1];
    if (!strcmp(s, "release")) release(BY_SYMBOL);
    else if (!strcmp(s, "release-v1")) release(BY_V1);
    else if (!strcmp(s, "release-proc")) release(BY_PROC);
    else if (!strcmp(s, "release-dlsym")) release(BY_DLSYM);
    else if (!strcmp(s, "release-shared")) release_shared();
    else if (!strcmp(s, "destroy-reuse")) destroy_reuse();
    else if (!strcmp(s, "race")) race();
    else CHECK(!"unknown scenario");
    printf("%s ok\n", s);
    return 0;
}
