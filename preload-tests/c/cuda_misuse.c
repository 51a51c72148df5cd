/* Issue 18: what programs do that a pool must answer as the driver does, over the simulators
 * (fakecudart.c over fakecuda.c). argv[1] names the scenario; each prints "SCENARIO ok" and passes
 * without tensormalloc:
 *   double-free, double-free-driver   cudaFree / cuMemFree_v2 twice: the second is refused (1)
 *   interior-free                      a free of a pointer inside a block: refused (1)
 *   double-free-host                   cudaFreeHost / cuMemFreeHost twice: the second is refused
 *   double-free-async                  cudaFreeAsync / cuMemFreeAsync twice: the second is refused
 *   free-host-thread                   cudaFreeHost on a thread that made no CUDA call succeeds
 *   free-no-context                    the driver's frees on a thread with no current context free
 *                                      (0), as the driver finds each allocation by its address;
 *                                      freed again, refused (1)
 *   buffer-ids                         CU_POINTER_ATTRIBUTE_BUFFER_ID: distinct per block, new at reuse
 *   deepbind-free                      a plugin loaded with RTLD_DEEPBIND and linked with -lcuda
 *                                      (CUDA_PLUGIN, c/cuda_plugin.c) allocates and frees its own
 *                                      memory, then frees blocks the program got: each is freed or
 *                                      refused (1), and no other block dies with it
 *   impossible-sizes                   SIZE_MAX and its neighbours (a negative size cast to
 *                                      size_t) from cudaMalloc, cuMemAlloc_v2 and cudaMallocHost:
 *                                      out of memory (2) as the runtime alone answers, the pool's cache
 *                                      as it was, a normal request served after
 *   oom-async, oom-other-context,      600 MiB freed of the device's 1 GiB: 700 MiB from the
 *   oom-managed, oom-vmm               runtime's stream-ordered pool, in another context, managed,
 *                                      or a VMM handle (cuMemCreate), fit
 * and in every case the blocks still live, and the ones allocated after, stay usable. */
#include <pthread.h>
#include "check.h"
#include "standin.h"
#include "cuda_vmm.h"

typedef unsigned long long CUdeviceptr;
typedef void *CUstream;

int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaGetLastError(void);
int cudaPeekAtLastError(void);
int cudaDeviceSynchronize(void);
int cudaMallocHost(void **, size_t);
int cudaFreeHost(void *);
int cudaMallocAsync(void **, size_t, CUstream);
int cudaFreeAsync(void *, CUstream);
int cudaStreamCreate(CUstream *);
int cudaStreamSynchronize(CUstream);
int cudaStreamDestroy(CUstream);
int cuMemFree_v2(CUdeviceptr);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFreeAsync(CUdeviceptr, CUstream);
int cuMemAllocHost_v2(void **, size_t);
int cuMemFreeHost(void *);

#define DEV(p) ((CUdeviceptr)(uintptr_t)(p))
enum { INVALID_VALUE = 1, INVALID_CONTEXT = 201 };

/* A free the driver refuses: invalid value, and the runtime's last error cleared for the next.
 * A runtime call's refusal is also the runtime's last error, as it records its own: peeked,
 * then read and cleared. */
static void refused_as(int by_runtime, int rc) {
    CHECK(rc == INVALID_VALUE);
    if (by_runtime) CHECK(cudaPeekAtLastError() == INVALID_VALUE && cudaGetLastError() == INVALID_VALUE);
    cudaGetLastError();
    CHECK(cudaGetLastError() == 0);
}

static void refused(int rc) { refused_as(0, rc); }

static int free_by(int by_driver, void *p) { return by_driver ? cuMemFree_v2(DEV(p)) : cudaFree(p); }

/* Two 1 MiB blocks (one segment in a split pool, the first at its start) and a 64 MiB one (a
 * segment of its own in every mode): each freed twice, the neighbour and later blocks intact. */
static void double_free(int by_driver) {
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK(cudaMalloc(&a, 1 * MB) == 0 && cudaMalloc(&b, 1 * MB) == 0);
    kernel_works(b, 1 * MB, 0xB1);
    CHECK(free_by(by_driver, a) == 0);
    refused_as(!by_driver, free_by(by_driver, a));
    refused_as(!by_driver, free_by(by_driver, a));
    CHECK(holds(b, 1 * MB, 0xB1));
    kernel_works(b, 1 * MB, 0xB2);
    CHECK(cudaMalloc(&c, 1 * MB) == 0);
    kernel_works(c, 1 * MB, 0xC1);
    CHECK(holds(b, 1 * MB, 0xB2));
    CHECK(free_by(by_driver, b) == 0 && free_by(by_driver, c) == 0);
    void *d = NULL, *e = NULL;
    CHECK(cudaMalloc(&d, 64 * MB) == 0);
    kernel_works(d, 64 * MB, 0xD1);
    CHECK(free_by(by_driver, d) == 0);
    refused_as(!by_driver, free_by(by_driver, d));
    CHECK(cudaMalloc(&e, 64 * MB) == 0);
    kernel_works(e, 64 * MB, 0xE1);
    CHECK(free_by(by_driver, e) == 0);
    CHECK(cudaGetLastError() == 0);
}

static void interior_free(void) {
    void *a = NULL, *b = NULL, *d = NULL;
    CHECK(cudaMalloc(&a, 1 * MB) == 0 && cudaMalloc(&b, 1 * MB) == 0 && cudaMalloc(&d, 64 * MB) == 0);
    kernel_works(a, 1 * MB, 0xA1);
    kernel_works(b, 1 * MB, 0xB1);
    kernel_works(d, 64 * MB, 0xD1);
    refused_as(1, cudaFree((char *)a + 4096));
    refused(cuMemFree_v2(DEV(b) + 512));
    refused_as(1, cudaFree((char *)d + 2 * MB));
    refused(cuMemFree_v2(DEV(d) + 32 * MB));
    CHECK(holds(a, 1 * MB, 0xA1) && holds(b, 1 * MB, 0xB1) && holds(d, 64 * MB, 0xD1));
    kernel_works(a, 1 * MB, 0xA2);
    kernel_works(d, 64 * MB, 0xD2);
    CHECK(cudaFree(a) == 0 && cudaFree(b) == 0 && cudaFree(d) == 0);
    CHECK(cudaGetLastError() == 0);
}

/* Pinned blocks, freed twice: the next pinned block of that size is usable at both ends. */
static void double_free_host(void) {
    for (int by_driver = 0; by_driver < 2; by_driver++) {
        for (int i = 0; i < 3; i++) {
            void *p = NULL, *q = NULL;
            CHECK((by_driver ? cuMemAllocHost_v2(&p, 4 * MB) : cudaMallocHost(&p, 4 * MB)) == 0 && p);
            memset(p, 0x11, 4 * MB);
            CHECK((by_driver ? cuMemFreeHost(p) : cudaFreeHost(p)) == 0);
            refused_as(!by_driver, by_driver ? cuMemFreeHost(p) : cudaFreeHost(p));
            CHECK(cudaMallocHost(&q, 4 * MB) == 0 && q);
            memset(q, 0x22, 4 * MB);
            CHECK(cudaFreeHost(q) == 0);
        }
    }
    CHECK(cudaGetLastError() == 0);
}

/* Stream-ordered frees twice: of a pooled block, and of the runtime's own stream-ordered block. */
static void double_free_async(void) {
    CUstream s = NULL;
    CHECK(cudaStreamCreate(&s) == 0);
    for (int by_driver = 0; by_driver < 2; by_driver++) {
        void *a = NULL, *b = NULL, *x = NULL;
        CHECK(cudaMalloc(&a, 8 * MB) == 0);
        CHECK(fakecuda_launch_memset(a, 0x77, 8 * MB) == 0);
        CHECK((by_driver ? cuMemFreeAsync(DEV(a), s) : cudaFreeAsync(a, s)) == 0);
        refused_as(!by_driver, by_driver ? cuMemFreeAsync(DEV(a), s) : cudaFreeAsync(a, s));
        CHECK(cudaStreamSynchronize(s) == 0);
        CHECK(cudaMalloc(&b, 8 * MB) == 0);
        kernel_works(b, 8 * MB, 0x78);
        CHECK(cudaFree(b) == 0);
        CHECK(cudaMallocAsync(&x, 4 * MB, s) == 0);
        CHECK((by_driver ? cuMemFreeAsync(DEV(x), s) : cudaFreeAsync(x, s)) == 0);
        refused_as(!by_driver, by_driver ? cuMemFreeAsync(DEV(x), s) : cudaFreeAsync(x, s));
        CHECK(cudaStreamSynchronize(s) == 0);
    }
    CHECK(cudaStreamDestroy(s) == 0);
}

static void *free_host_on_thread(void *p) {
    return (void *)(intptr_t)cudaFreeHost(p);
}

/* A pinned block freed by a thread that made no CUDA call: the runtime binds it a context. */
static void free_host_thread(void) {
    for (int i = 0; i < 3; i++) {
        void *p = NULL, *rc = NULL;
        CHECK(cudaMallocHost(&p, 4 * MB) == 0 && p);
        memset(p, 0x33, 4 * MB);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, free_host_on_thread, p) == 0 && pthread_join(t, &rc) == 0);
        CHECK((intptr_t)rc == 0);
        void *q = NULL;
        CHECK(cudaMallocHost(&q, 4 * MB) == 0 && q);
        memset(q, 0x44, 4 * MB);
        CHECK(cudaFreeHost(q) == 0);
    }
}

struct no_ctx { CUdeviceptr pooled, managed; void *pinned; int rc[3]; };

static void *driver_frees_without_context(void *arg) {
    struct no_ctx *n = arg;
    n->rc[0] = cuMemFree_v2(n->pooled);
    n->rc[1] = cuMemFree_v2(n->managed);
    n->rc[2] = cuMemFreeHost(n->pinned);
    return NULL;
}

int cudaMallocManaged(void **, size_t, unsigned);

/* The driver's frees need a current context: with none, 201 and nothing freed, whoever's block. */
static void free_no_context(void) {
    void *a = NULL, *m = NULL, *h = NULL;
    CHECK(cudaMalloc(&a, 1 * MB) == 0 && cudaMallocManaged(&m, 1 * MB, 1) == 0 && cudaMallocHost(&h, 1 * MB) == 0);
    kernel_works(a, 1 * MB, 0x55);
    struct no_ctx n = {DEV(a), DEV(m), h, {-1, -1, -1}};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, driver_frees_without_context, &n) == 0 && pthread_join(t, NULL) == 0);
    printf("no-context rc %d %d %d\n", n.rc[0], n.rc[1], n.rc[2]);
    CHECK(n.rc[0] == 0 && n.rc[1] == 0 && n.rc[2] == 0);
    refused(cuMemFree_v2(DEV(a))); /* gone: a second free is refused */
    refused(cuMemFreeHost(h));
    void *b = NULL, *g = NULL;
    CHECK(cudaMalloc(&b, 1 * MB) == 0 && cudaMallocHost(&g, 1 * MB) == 0); /* what comes after works */
    kernel_works(b, 1 * MB, 0x56);
    memset(g, 0x57, 1 * MB);
    CHECK(cudaFree(b) == 0 && cudaFreeHost(g) == 0);
}

static void impossible_sizes(void) {
    void *keep = NULL, *p = NULL;
    CHECK(cudaMalloc(&keep, 100 * MB) == 0 && cudaFree(keep) == 0); /* the pool caches it */
    tm_stats_t before = {.size = sizeof before};
    int ours = tm_stats(&before) == 0;
    size_t sizes[] = {SIZE_MAX, SIZE_MAX - 3, SIZE_MAX - 510, (size_t)-16, (size_t)1 << 60};
    for (int i = 0; i < 5; i++) {
        void *sentinel = (void *)0x1234;
        p = sentinel;
        CHECK(cudaMalloc(&p, sizes[i]) == 2);
        CHECK(cudaGetLastError() == 2);
        CUdeviceptr d = 0x5678;
        CHECK(cuMemAlloc_v2(&d, sizes[i]) == 2);
        void *h = sentinel;
        CHECK(cudaMallocHost(&h, sizes[i]) == 2);
        cudaGetLastError();
    }
    if (ours) {
        tm_stats_t after = {.size = sizeof after};
        CHECK(tm_stats(&after) == 0 && after.cuda_reserved_bytes == before.cuda_reserved_bytes);
    }
    CHECK(cudaMalloc(&p, 100 * MB) == 0);
    kernel_works(p, 100 * MB, 0x42);
    CHECK(cudaFree(p) == 0);
}

int cuPointerGetAttribute(void *, int, CUdeviceptr);
int cuPointerGetAttributes(unsigned, int *, void **, CUdeviceptr);
enum { BUFFER_ID = 7, RANGE_START_ADDR = 11 };

static unsigned long long buffer_id(void *p) {
    unsigned long long id = 0, id2 = 0;
    CUdeviceptr start = 0;
    CHECK(cuPointerGetAttribute(&id, BUFFER_ID, DEV(p)) == 0 && id);
    int attrs[] = {RANGE_START_ADDR, BUFFER_ID};
    void *data[] = {&start, &id2};
    CHECK(cuPointerGetAttributes(2, attrs, data, DEV(p)) == 0 && id2 == id);
    return id;
}

/* Libraries key registrations of memory by buffer id (NCCL, UCX, MPI): two live allocations
 * never share one, and a new allocation never has an old one's, wherever it lies. */
static void buffer_ids(void) {
    enum { N = 8 };
    unsigned long long seen[4 * N];
    int n = 0;
    for (int round = 0; round < 4; round++) {
        void *p[N];
        for (int i = 0; i < N; i++) {
            CHECK(cudaMalloc(&p[i], (i % 2 ? 1 : 3) * MB) == 0);
            unsigned long long id = buffer_id(p[i]);
            CHECK(buffer_id((char *)p[i] + 4096) == id); /* anywhere inside it */
            for (int k = 0; k < n; k++) CHECK(seen[k] != id);
            seen[n++] = id;
        }
        for (int i = 0; i < N; i++) CHECK(cudaFree(p[i]) == 0);
    }
}

typedef struct fake_ctx *CUcontext;
int cudaSetDevice(int);
int cudaMemGetInfo(size_t *, size_t *);
int cuCtxCreate_v2(CUcontext *, unsigned, int);
int cuCtxDestroy_v2(CUcontext);
int cuMemAlloc_v2(CUdeviceptr *, size_t);


enum { ELSEWHERE_ASYNC, ELSEWHERE_CONTEXT, ELSEWHERE_MANAGED, ELSEWHERE_VMM };

/* Memory a pool caches is memory the program may need elsewhere (FAKECUDA_DEVICE_MEM: 1 GiB). */
static void oom_elsewhere(int where) {
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 600 * MB) == 0 && cudaFree(a) == 0);
    size_t free_bytes = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total) == 0 && free_bytes > 900 * MB); /* what the program plans by */
    if (where == ELSEWHERE_MANAGED) {
        void *m = NULL;
        CHECK(cudaMallocManaged(&m, 700 * MB, 1) == 0);
        kernel_works((char *)m + 699 * MB, 1 * MB, 0x64);
        CHECK(cudaFree(m) == 0);
    } else if (where == ELSEWHERE_VMM) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1, prop.location.type = 1, prop.location.id = 0; /* pinned, on device 0 */
        unsigned long long h = 0;
        CHECK(cuMemCreate(&h, 700 * MB, &prop, 0) == 0 && cuMemRelease(h) == 0);
    } else if (where == ELSEWHERE_CONTEXT) {
        CUcontext ctx = NULL;
        CUdeviceptr p = 0;
        CHECK(cuCtxCreate_v2(&ctx, 0, 0) == 0);
        CHECK(cuMemAlloc_v2(&p, 700 * MB) == 0);
        kernel_works((char *)(uintptr_t)p + 699 * MB, 1 * MB, 0x61);
        CHECK(cuMemFree_v2(p) == 0 && cuCtxDestroy_v2(ctx) == 0);
        CHECK(cudaSetDevice(0) == 0);
    } else {
        CUstream s = NULL;
        void *x = NULL;
        CHECK(cudaStreamCreate(&s) == 0);
        CHECK(cudaMallocAsync(&x, 700 * MB, s) == 0);
        kernel_works((char *)x + 699 * MB, 1 * MB, 0x62);
        CHECK(cudaFreeAsync(x, s) == 0 && cudaStreamSynchronize(s) == 0 && cudaStreamDestroy(s) == 0);
    }
    CHECK(cudaGetLastError() == 0);
    CHECK(cudaMalloc(&b, 64 * MB) == 0);
    kernel_works(b, 64 * MB, 0x63);
    CHECK(cudaFree(b) == 0);
}

static void deepbind_free(void) {
    const char *path = getenv("CUDA_PLUGIN");
    CHECK(path);
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CHECK(cudaMalloc(&a, 1 * MB) == 0 && cudaMalloc(&b, 1 * MB) == 0 && cudaMalloc(&c, 64 * MB) == 0);
    kernel_works(a, 1 * MB, 0xD1);
    kernel_works(b, 1 * MB, 0xD2);
    kernel_works(c, 64 * MB, 0xD3);
    void *lib = dlopen(path, RTLD_NOW | RTLD_DEEPBIND);
    CHECK(lib);
    int (*plugin_alloc)(CUdeviceptr *, size_t) = (int (*)(CUdeviceptr *, size_t))dlsym(lib, "plugin_alloc");
    int (*plugin_free)(CUdeviceptr) = (int (*)(CUdeviceptr))dlsym(lib, "plugin_free");
    CHECK(plugin_alloc && plugin_free);
    CUdeviceptr own = 0;
    CHECK(plugin_alloc(&own, 1 * MB) == 0);
    kernel_works((void *)(uintptr_t)own, 1 * MB, 0xD4);
    CHECK(plugin_free(own) == 0);
    /* The program's blocks freed inside the plugin: the driver's own free, past any preload. */
    int rc_a = plugin_free(DEV(a)), rc_c = plugin_free(DEV(c));
    CHECK((rc_a == 0 || rc_a == INVALID_VALUE) && (rc_c == 0 || rc_c == INVALID_VALUE));
    printf("plugin frees %d %d\n", rc_a, rc_c);
    CHECK(holds(b, 1 * MB, 0xD2));
    kernel_works(b, 1 * MB, 0xD5);
    CHECK(cudaFree(b) == 0);
    for (int i = 0; i < 4; i++) {
        CHECK(cudaMalloc(&d, 1 * MB) == 0);
        kernel_works(d, 1 * MB, 0xD6 + i);
        CHECK(cudaFree(d) == 0);
    }
    CHECK(cudaGetLastError() == 0);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    const char *s = argv[1];
    if (!strcmp(s, "double-free")) double_free(0);
    else if (!strcmp(s, "double-free-driver")) double_free(1);
    else if (!strcmp(s, "interior-free")) interior_free();
    else if (!strcmp(s, "double-free-host")) double_free_host();
    else if (!strcmp(s, "double-free-async")) double_free_async();
    else if (!strcmp(s, "free-host-thread")) free_host_thread();
    else if (!strcmp(s, "free-no-context")) free_no_context();
    else if (!strcmp(s, "buffer-ids")) buffer_ids();
    else if (!strcmp(s, "impossible-sizes")) impossible_sizes();
    else if (!strcmp(s, "deepbind-free")) deepbind_free();
    else if (!strcmp(s, "oom-async")) oom_elsewhere(ELSEWHERE_ASYNC);
    else if (!strcmp(s, "oom-other-context")) oom_elsewhere(ELSEWHERE_CONTEXT);
    else if (!strcmp(s, "oom-managed")) oom_elsewhere(ELSEWHERE_MANAGED);
    else if (!strcmp(s, "oom-vmm")) oom_elsewhere(ELSEWHERE_VMM);
    else CHECK(!"unknown scenario");
    printf("%s ok\n", s);
    return 0;
}
