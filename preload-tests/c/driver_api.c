/* Issue 12: the pool reached through the driver API (the stand-in libcuda.so.1, a simulator) on
 * every path a program reaches it by. argv[1] names the path the driver entry points are taken by:
 *   linked    the symbols (linked with -lcuda)
 *   dlsym     dlopen("libcuda.so.1") and dlsym by name (as Numba and JAX do)
 *   procaddr  cuGetProcAddress_v2 by base name (as both runtimes do); procaddr-v1: cuGetProcAddress
 *   entry     cudaGetDriverEntryPoint of the shared runtime
 * argv[2] names the workload: pairs (1000 x cuMemAlloc/cuMemFree of 32 MiB), pitch, meminfo, host,
 * mixed (runtime and driver allocations and frees crossed), and issue 11's calls on every path:
 * reset (a primary-context reset, then a block a kernel can use), range (address range of a
 * block, not of a pooled segment), ipc (a handle of a block that may share a segment: refused or
 * not, and whether it is tensormalloc's own, printed). It prints the stand-in's counters. */
#include "check.h"

typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
struct fakecuda_counters { uint64_t mallocs, frees, syncs, host_allocs, host_frees; uint64_t used[4]; };

static struct {
    int (*init)(unsigned);
    int (*retain)(CUcontext *, int);
    int (*set_current)(CUcontext);
    int (*alloc)(CUdeviceptr *, size_t);
    int (*free)(CUdeviceptr);
    int (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    int (*info)(size_t *, size_t *);
    int (*host_alloc)(void **, size_t, unsigned);
    int (*free_host)(void *);
    int (*reset)(int);
    int (*range)(CUdeviceptr *, size_t *, CUdeviceptr);
    int (*ipc)(void *, CUdeviceptr);
    void (*counters)(struct fakecuda_counters *);
} D;

int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
int cuMemGetInfo_v2(size_t *, size_t *);
int cuMemHostAlloc(void **, size_t, unsigned);
int cuMemFreeHost(void *);
int cuDevicePrimaryCtxReset_v2(int);
int cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);
int cuIpcGetMemHandle(void *, CUdeviceptr);
void fakecuda_get_counters(struct fakecuda_counters *);
int fakecuda_launch_memset(void *, int, size_t);
int cuCtxSynchronize(void);
int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaGetDriverEntryPoint(const char *, void **, unsigned long long, int *);

typedef int (*get_proc_v2_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*get_proc_v1_fn)(const char *, void **, int, unsigned long long);
static get_proc_v2_fn get_proc_v2;
static get_proc_v1_fn get_proc_v1;
static int use_entry_point;

static void *by_proc(const char *base) {
    void *fn = NULL;
    int status = 0;
    if (use_entry_point) CHECK(cudaGetDriverEntryPoint(base, &fn, 0, &status) == 0);
    else if (get_proc_v2) CHECK(get_proc_v2(base, &fn, 12000, 0, &status) == 0);
    else CHECK(get_proc_v1(base, &fn, 12000, 0) == 0);
    CHECK(fn != NULL);
    return fn;
}

static void bind(const char *path) {
    D.counters = fakecuda_get_counters;
    if (!strcmp(path, "linked")) {
        D.init = cuInit, D.retain = cuDevicePrimaryCtxRetain, D.set_current = cuCtxSetCurrent;
        D.alloc = cuMemAlloc_v2, D.free = cuMemFree_v2, D.pitch = cuMemAllocPitch_v2, D.info = cuMemGetInfo_v2;
        D.host_alloc = cuMemHostAlloc, D.free_host = cuMemFreeHost;
        D.reset = cuDevicePrimaryCtxReset_v2, D.range = cuMemGetAddressRange_v2, D.ipc = cuIpcGetMemHandle;
        return;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL);
    if (!strcmp(path, "dlsym")) {
        D.init = (int (*)(unsigned))dlsym(lib, "cuInit");
        D.retain = (int (*)(CUcontext *, int))dlsym(lib, "cuDevicePrimaryCtxRetain");
        D.set_current = (int (*)(CUcontext))dlsym(lib, "cuCtxSetCurrent");
        D.alloc = (int (*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
        D.free = (int (*)(CUdeviceptr))dlsym(lib, "cuMemFree_v2");
        D.pitch = (int (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))dlsym(lib, "cuMemAllocPitch_v2");
        D.info = (int (*)(size_t *, size_t *))dlsym(lib, "cuMemGetInfo_v2");
        D.host_alloc = (int (*)(void **, size_t, unsigned))dlsym(lib, "cuMemHostAlloc");
        D.free_host = (int (*)(void *))dlsym(lib, "cuMemFreeHost");
        D.reset = (int (*)(int))dlsym(lib, "cuDevicePrimaryCtxReset_v2");
        D.range = (int (*)(CUdeviceptr *, size_t *, CUdeviceptr))dlsym(lib, "cuMemGetAddressRange_v2");
        D.ipc = (int (*)(void *, CUdeviceptr))dlsym(lib, "cuIpcGetMemHandle");
        return;
    }
    if (!strcmp(path, "procaddr")) get_proc_v2 = (get_proc_v2_fn)dlsym(lib, "cuGetProcAddress_v2");
    else if (!strcmp(path, "procaddr-v1")) get_proc_v1 = (get_proc_v1_fn)dlsym(lib, "cuGetProcAddress");
    else if (!strcmp(path, "entry")) use_entry_point = 1;
    else CHECK(!"unknown path");
    CHECK(get_proc_v2 || get_proc_v1 || use_entry_point);
    D.init = (int (*)(unsigned))by_proc("cuInit");
    D.retain = (int (*)(CUcontext *, int))by_proc("cuDevicePrimaryCtxRetain");
    D.set_current = (int (*)(CUcontext))by_proc("cuCtxSetCurrent");
    D.alloc = (int (*)(CUdeviceptr *, size_t))by_proc("cuMemAlloc");
    D.free = (int (*)(CUdeviceptr))by_proc("cuMemFree");
    D.pitch = (int (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))by_proc("cuMemAllocPitch");
    D.info = (int (*)(size_t *, size_t *))by_proc("cuMemGetInfo");
    D.host_alloc = (int (*)(void **, size_t, unsigned))by_proc("cuMemHostAlloc");
    D.free_host = (int (*)(void *))by_proc("cuMemFreeHost");
    D.reset = (int (*)(int))by_proc("cuDevicePrimaryCtxReset");
    D.range = (int (*)(CUdeviceptr *, size_t *, CUdeviceptr))by_proc("cuMemGetAddressRange");
    D.ipc = (int (*)(void *, CUdeviceptr))by_proc("cuIpcGetMemHandle");
}

static void pairs(void) {
    for (int i = 0; i < 1000; i++) {
        CUdeviceptr p = 0;
        CHECK(D.alloc(&p, 32 * MB) == 0 && p);
        CHECK(D.free(p) == 0);
    }
}

static void pitch(void) {
    for (int i = 0; i < 100; i++) {
        CUdeviceptr p = 0;
        size_t pitch = 0;
        CHECK(D.pitch(&p, &pitch, 1000 + i, 2000, 4) == 0 && p);
        CHECK(pitch >= (size_t)(1000 + i) && pitch % 512 == 0);
        memset((void *)(uintptr_t)p, 0x5c, pitch * 2000); /* the whole pitched block is usable */
        CHECK(D.free(p) == 0);
    }
}

static void meminfo(void) {
    size_t f0, t0, f1, t1;
    CHECK(D.info(&f0, &t0) == 0);
    CUdeviceptr p = 0;
    CHECK(D.alloc(&p, 256 * MB) == 0 && D.free(p) == 0);
    CHECK(D.info(&f1, &t1) == 0);
    CHECK(t1 == t0 && f1 == f0); /* cached memory counts as free */
}

static void host(void) {
    for (int i = 0; i < 20; i++) {
        void *p = NULL;
        CHECK(D.host_alloc(&p, 100 * MB, 0) == 0 && p);
        ((char *)p)[0] = (char)i, ((char *)p)[100 * MB - 1] = (char)i;
        CHECK(D.free_host(p) == 0);
    }
}

/* One pool whatever the path: runtime blocks freed by the driver and the other way round. */
static void mixed(void) {
    for (int i = 0; i < 500; i++) {
        void *a = NULL;
        CUdeviceptr b = 0;
        CHECK(cudaMalloc(&a, 32 * MB) == 0 && D.alloc(&b, 32 * MB) == 0);
        CHECK(D.free((CUdeviceptr)(uintptr_t)a) == 0 && cudaFree((void *)(uintptr_t)b) == 0);
    }
}

/* A block cached before a primary-context reset must never come back: a kernel on it fails. */
static void reset(CUcontext *ctx) {
    CUdeviceptr p = 0, q = 0;
    CHECK(D.alloc(&p, 64 * MB) == 0 && fakecuda_launch_memset((void *)(uintptr_t)p, 1, 64 * MB) == 0);
    CHECK(cuCtxSynchronize() == 0 && D.free(p) == 0);
    CHECK(D.reset(0) == 0);
    CHECK(D.retain(ctx, 0) == 0 && D.set_current(*ctx) == 0); /* the program brings it back */
    for (int i = 0; i < 3; i++) {
        CHECK(D.alloc(&q, 64 * MB) == 0);
        CHECK(fakecuda_launch_memset((void *)(uintptr_t)q, 2 + i, 64 * MB) == 0);
        CHECK(cuCtxSynchronize() == 0 && ((unsigned char *)(uintptr_t)q)[64 * MB - 1] == 2 + i);
        CHECK(D.free(q) == 0);
    }
}

/* The range of a block, whatever segment a pool carved it from. */
static void range(void) {
    CUdeviceptr a = 0, b = 0, base = 0;
    size_t size = 0;
    CHECK(D.alloc(&a, 1 * MB) == 0 && D.alloc(&b, 1 * MB) == 0);
    CHECK(D.range(&base, &size, b + 100) == 0);
    CHECK(base == b && size >= 1 * MB && size <= 1 * MB + 64 * 1024);
    CHECK(D.free(a) == 0 && D.free(b) == 0);
}

/* A handle of a 1 MiB block: 0, or refused with CUDA_ERROR_INVALID_VALUE; never anything else.
 * Prints whether the handle is tensormalloc's own (its first bytes). */
static void ipc(void) {
    CUdeviceptr a = 0, b = 0;
    char handle[64];
    CHECK(D.alloc(&a, 1 * MB) == 0 && D.alloc(&b, 1 * MB) == 0);
    int rc = D.ipc(handle, b);
    CHECK(rc == 0 || rc == 1);
    printf("ipc rc %d ours %d\n", rc, rc == 0 && !memcmp(handle, "tmIPCv1", 8));
    CHECK(D.free(a) == 0 && D.free(b) == 0);
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    bind(argv[1]);
    CUcontext ctx = NULL;
    CHECK(D.init(0) == 0 && D.retain(&ctx, 0) == 0 && D.set_current(ctx) == 0);
    const char *w = argv[2];
    if (!strcmp(w, "pairs")) pairs();
    else if (!strcmp(w, "pitch")) pitch();
    else if (!strcmp(w, "meminfo")) meminfo();
    else if (!strcmp(w, "host")) host();
    else if (!strcmp(w, "mixed")) mixed();
    else if (!strcmp(w, "reset")) reset(&ctx);
    else if (!strcmp(w, "range")) range();
    else if (!strcmp(w, "ipc")) ipc();
    else CHECK(!"unknown workload");
    struct fakecuda_counters c;
    D.counters(&c);
    printf("%s %s ok mallocs %llu frees %llu host_allocs %llu\n", argv[1], w, (unsigned long long)c.mallocs,
           (unsigned long long)c.frees, (unsigned long long)c.host_allocs);
    return 0;
}
