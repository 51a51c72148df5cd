/* The CUDA contract a pool must keep (issue 11), over the simulators (fakecudart.c over
 * fakecuda.c): device reset and context destruction, IPC handles, address-range queries,
 * stream-ordered frees, managed and VMM memory, re-entrant runtimes, driver frees of runtime
 * blocks. argv[1] names the scenario; each prints "SCENARIO ok". They pass without tensormalloc. */
#include <dlfcn.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "standin.h"
#include "cuda_vmm.h"

typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;
typedef void *CUstream;
typedef struct { char reserved[64]; } CUipcMemHandle;
struct cudaPointerAttributes { int type; int device; void *devicePointer; void *hostPointer; };

int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaSetDevice(int);
int cudaGetDevice(int *);
int cudaGetLastError(void);
int cudaDeviceSynchronize(void);
int cudaDeviceReset(void);
int cudaMallocHost(void **, size_t);
int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);
int cudaMemGetInfo(size_t *, size_t *);
int cudaIpcGetMemHandle(CUipcMemHandle *, void *);
int cudaIpcOpenMemHandle(void **, CUipcMemHandle, unsigned);
int cudaIpcCloseMemHandle(void *);
int cudaPointerGetAttributes(struct cudaPointerAttributes *, const void *);
int cudaMallocAsync(void **, size_t, CUstream);
int cudaFreeAsync(void *, CUstream);
int cudaMallocManaged(void **, size_t, unsigned);
int cudaStreamCreate(CUstream *);
int cudaStreamSynchronize(CUstream);
int cudaStreamDestroy(CUstream);

int cuInit(unsigned);
int cuDeviceGet(int *, int);
int cuDevicePrimaryCtxReset_v2(int);
int cuDevicePrimaryCtxGetState(int, unsigned *, int *);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuDevicePrimaryCtxRelease_v2(int);
int cuCtxCreate_v2(CUcontext *, unsigned, int);
int cuCtxDestroy_v2(CUcontext);
int cuMemFree_v2(CUdeviceptr);
int cuMemFreeAsync(CUdeviceptr, CUstream);
int cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
int cuStreamBeginCapture_v2(CUstream, int);
struct fakecuda_counters { uint64_t mallocs, frees, syncs, host_allocs, host_frees; uint64_t used[4]; };
void fakecuda_get_counters(struct fakecuda_counters *);
int cuStreamEndCapture(CUstream, void **);
int cuThreadExchangeStreamCaptureMode(int *);
int cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);
int cuPointerGetAttribute(void *, int, CUdeviceptr);
int cuPointerGetAttributes(unsigned, int *, void **, CUdeviceptr);
int cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
int cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned);
int cuIpcCloseMemHandle(CUdeviceptr);


enum { CU_POINTER_ATTRIBUTE_CONTEXT = 1, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
       CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11, CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12 };
enum { CU_MEMORYTYPE_DEVICE = 2 };
enum { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
enum { CUDA_ERROR_NOT_FOUND = 500 };
#define DEV(p) ((CUdeviceptr)(uintptr_t)(p))

/* The byte at p, read without faulting (a dead block answers 700). */
/* ---------- context lifetime ---------- */

static void reset_scenario(int by_driver, int keep_live) {
    int dev = -1;
    CHECK(cudaGetDevice(&dev) == 0);
    void *p = NULL;
    CHECK(cudaMalloc(&p, 64 * MB) == 0);
    kernel_works(p, 64 * MB, 0x21);
    if (!keep_live) CHECK(cudaFree(p) == 0);
    if (by_driver) CHECK(cuDevicePrimaryCtxReset_v2(dev) == 0);
    else CHECK(cudaDeviceReset() == 0);
    /* The reset context stays ended until the program asks again: nothing of ours made it anew
     * (a forgotten expandable pool once retained it to unmap chunks it no longer had). */
    unsigned flags = 0;
    int active = -1;
    CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active) == 0 && active == 0);
    if (keep_live) {
        CHECK(cudaFree(p) != 0); /* the reset freed it: the runtime's answer for a dead pointer */
        cudaGetLastError();
    }
    /* The runtime makes a new primary context at its next call, whichever it is: pinned memory
     * and the device's figures too (each first after the reset in one of the variants). */
    for (int k = 0; k < 2; k++) {
        if ((k == 0) == (by_driver == 0)) {
            void *h = NULL;
            CHECK(cudaMallocHost(&h, 4096) == 0 && h != NULL);
            memset(h, 1, 4096);
            CHECK(cudaFreeHost(h) == 0);
        } else {
            size_t free_bytes = 0, total_bytes = 0;
            CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == 0 && total_bytes > 0);
        }
    }
    for (int i = 0; i < 3; i++) {
        void *q = NULL;
        CHECK(cudaMalloc(&q, 64 * MB) == 0);
        kernel_works(q, 64 * MB, 0x5a + i);
        CHECK(cudaFree(q) == 0);
    }
    CHECK(cudaGetLastError() == 0);
}

/* A device the pool entered on its own (PyTorch's pluggable allocator asks for device 1 from a
 * thread on device 0: the pool retains device 1's primary context to enter it). The program, which
 * holds its own reference, resets device 1 and releases its reference, as NVIDIA documents a
 * holder must (a reset does not release): the context stays ended, and a retain and release of the
 * program's leave it ended. Run with FAKECUDA_RESET_KEEPS_REFS=1. Needs two devices. */
static void primary_state(int device, int want_active) {
    unsigned flags = 0;
    int active = -1;
    CHECK(cuDevicePrimaryCtxGetState(device, &flags, &active) == 0 && active == want_active);
}

static void reset_entered(void) {
    CHECK(cuInit(0) == 0);
    CHECK(cudaSetDevice(0) == 0);
    void *p = NULL;
    CHECK(cudaMalloc(&p, 8 * MB) == 0);
    CHECK(cudaFree(p) == 0);
    CUcontext ctx = NULL;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 1) == 0 && ctx);
    void *(*alloc)(long, int, void *) = (void *(*)(long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_alloc");
    void (*release)(void *, long, int, void *) = (void (*)(void *, long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_free");
    if (alloc && release) {
        void *q = alloc(8 * MB, 1, NULL);
        CHECK(q);
        release(q, 8 * MB, 1, NULL);
    }
    int dev = -1;
    CHECK(cudaGetDevice(&dev) == 0 && dev == 0);
    primary_state(1, 1);
    CHECK(cuDevicePrimaryCtxReset_v2(1) == 0);
    primary_state(1, 0);
    CHECK(cuDevicePrimaryCtxRelease_v2(1) == 0);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 1) == 0 && ctx);
    primary_state(1, 1);
    CHECK(cuDevicePrimaryCtxRelease_v2(1) == 0);
    primary_state(1, 0);
}

static void ctx_destroy(void) {
    int dev = -1;
    CHECK(cuInit(0) == 0 && cuDeviceGet(&dev, 0) == 0);
    CUcontext ctx = NULL;
    CHECK(cuCtxCreate_v2(&ctx, 0, dev) == 0 && ctx);
    void *p = NULL;
    CHECK(cudaMalloc(&p, 64 * MB) == 0); /* the runtime allocates in the current (user) context */
    kernel_works(p, 64 * MB, 0x31);
    CHECK(cudaFree(p) == 0);
    CHECK(cuCtxDestroy_v2(ctx) == 0);
    CHECK(cudaSetDevice(0) == 0); /* back to the primary context */
    for (int i = 0; i < 3; i++) {
        void *q = NULL;
        CHECK(cudaMalloc(&q, 64 * MB) == 0);
        kernel_works(q, 64 * MB, 0x41 + i);
        CHECK(cudaFree(q) == 0);
    }
}

static void driver_free(void) {
    for (int i = 0; i < 3; i++) {
        void *p = NULL;
        CHECK(cudaMalloc(&p, 64 * MB) == 0);
        kernel_works(p, 64 * MB, 0x61);
        CHECK(cuMemFree_v2(DEV(p)) == 0); /* legal: the same allocation */
        void *q = NULL;
        CHECK(cudaMalloc(&q, 64 * MB) == 0);
        kernel_works(q, 64 * MB, 0x62 + i);
        CHECK(cudaFree(q) == 0);
    }
    void *a = NULL, *b = NULL, *c = NULL; /* two small blocks: a pool may carve both from one segment */
    CHECK(cudaMalloc(&a, 1 * MB) == 0 && cudaMalloc(&b, 1 * MB) == 0);
    CHECK(cuMemFree_v2(DEV(b)) == 0 && cuMemFree_v2(DEV(a)) == 0);
    CHECK(cudaMalloc(&c, 1 * MB) == 0);
    kernel_works(c, 1 * MB, 0x6f);
    CHECK(cudaFree(c) == 0);
}

/* ---------- IPC ---------- */

static void to_hex(const CUipcMemHandle *h, char *out) {
    for (int i = 0; i < 64; i++) sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static void from_hex(const char *s, CUipcMemHandle *h) {
    CHECK(strlen(s) == 128);
    for (int i = 0; i < 64; i++) {
        unsigned v;
        CHECK(sscanf(s + 2 * i, "%2x", &v) == 1);
        h->reserved[i] = (char)v;
    }
}

/* Exports b through the runtime or the driver: 0, or the refusal (which must be invalid-value). */
static int export(CUipcMemHandle *h, void *b, int by_driver) {
    memset(h, 0, sizeof *h);
    int r = by_driver ? cuIpcGetMemHandle(h, DEV(b)) : cudaIpcGetMemHandle(h, b);
    if (r) {
        CHECK(r == 1); /* CUDA_ERROR_INVALID_VALUE / cudaErrorInvalidValue */
        cudaGetLastError();
        printf("ipc refused\n");
    }
    return r;
}

/* Starts this program as "ipc-child HEX DRIVER WAITFD SIGNALFD BYTES" (the block's size). */
static pid_t spawn_child(const CUipcMemHandle *h, int by_driver, int wait_fd, int signal_fd, size_t n) {
    char hex[129], mode[4], wfd[16], sfd[16], bytes[24];
    to_hex(h, hex);
    snprintf(mode, sizeof mode, "%d", by_driver);
    snprintf(wfd, sizeof wfd, "%d", wait_fd);
    snprintf(sfd, sizeof sfd, "%d", signal_fd);
    snprintf(bytes, sizeof bytes, "%zu", n);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        char *argv[] = {"cuda_correct", "ipc-child", hex, mode, wfd, sfd, bytes, NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    return pid;
}

static void child_exited_0(pid_t pid) {
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void two_blocks_of(void **a, void **b, size_t n) {
    CHECK(cudaMalloc(a, n) == 0 && cudaMalloc(b, n) == 0);
    CHECK(fakecuda_launch_memset(*a, 0xAA, n) == 0 && fakecuda_launch_memset(*b, 0xBB, n) == 0);
    CHECK(cudaDeviceSynchronize() == 0);
}

static void two_blocks(void **a, void **b) { two_blocks_of(a, b, 1 * MB); }

/* Blocks of n bytes: 1 MiB ones share a segment in a split pool; 64 MiB ones never do. */
static void ipc(int by_driver, size_t n) {
    void *a = NULL, *b = NULL;
    two_blocks_of(&a, &b, n);
    CUipcMemHandle h;
    if (export(&h, b, by_driver)) return;
    child_exited_0(spawn_child(&h, by_driver, -1, -1, n));
    CHECK(cudaFree(a) == 0 && cudaFree(b) == 0);
}

/* The child opens b, the parent frees b and fills a new block with 0xCC: the child still
 * reads b's bytes, never the new block's. */
static void ipc_after_free(void) {
    void *a = NULL, *b = NULL;
    two_blocks(&a, &b);
    CUipcMemHandle h;
    if (export(&h, b, 0)) return;
    int to_child[2], from_child[2];
    CHECK(pipe(to_child) == 0 && pipe(from_child) == 0);
    pid_t pid = spawn_child(&h, 0, to_child[0], from_child[1], 1 * MB);
    close(to_child[0]);
    close(from_child[1]);
    char c;
    CHECK(read(from_child[0], &c, 1) == 1); /* the child has opened the handle */
    CHECK(cudaFree(b) == 0);
    void *n = NULL;
    CHECK(cudaMalloc(&n, 1 * MB) == 0);
    kernel_works(n, 1 * MB, 0xCC);
    CHECK(write(to_child[1], "g", 1) == 1);
    child_exited_0(pid);
    CHECK(cudaFree(a) == 0 && cudaFree(n) == 0);
}

static int ipc_child(char **argv) {
    CUipcMemHandle h;
    from_hex(argv[2], &h);
    int by_driver = atoi(argv[3]), wait_fd = atoi(argv[4]), signal_fd = atoi(argv[5]);
    CHECK(cudaSetDevice(0) == 0); /* a current context for the driver path too */
    void *p = NULL;
    if (by_driver) {
        CUdeviceptr d = 0;
        CHECK(cuIpcOpenMemHandle_v2(&d, h, 1) == 0);
        p = (void *)(uintptr_t)d;
    } else {
        CHECK(cudaIpcOpenMemHandle(&p, h, 1) == 0);
    }
    /* Its range is the block's, as the driver answers for an allocation of its own: never a
     * segment holding the exporter's other blocks. */
    size_t n = (size_t)strtoull(argv[6], NULL, 10), size = 0, range_size = 0;
    CUdeviceptr base = 0, range_start = 0;
    CHECK(cuMemGetAddressRange_v2(&base, &size, DEV(p) + 100) == 0 && base == DEV(p) && size == n);
    CHECK(cuPointerGetAttribute(&range_start, 11 /* RANGE_START_ADDR */, DEV(p) + 100) == 0 && range_start == DEV(p));
    CHECK(cuPointerGetAttribute(&range_size, 12 /* RANGE_SIZE */, DEV(p)) == 0 && range_size == n);
    for (int round = 0; round < (wait_fd >= 0 ? 2 : 1); round++) {
        if (round == 1) {
            char c;
            CHECK(write(signal_fd, "o", 1) == 1);
            CHECK(read(wait_fd, &c, 1) == 1); /* the parent freed the block and reused memory */
        }
        int first = byte_at(p), last = byte_at((char *)p + MB - 1);
        if (first != 0xBB || last != 0xBB) {
            printf("ipc-child: read 0x%x at the start and 0x%x at 1 MiB - 1, want 0xbb (another block's memory)\n", first, last);
            return 1;
        }
    }
    CHECK((by_driver ? cuIpcCloseMemHandle(DEV(p)) : cudaIpcCloseMemHandle(p)) == 0);
    return 0;
}

/* ---------- pointer queries ---------- */

static void range_on(int dev) {
    CHECK(cudaSetDevice(dev) == 0);
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 1 * MB) == 0 && cudaMalloc(&b, 1 * MB) == 0);
    for (int off = 0; off <= 100; off += 100) {
        CUdeviceptr p = DEV(b) + off, base = 0, start = 0;
        size_t size = 0, rsize = 0;
        CHECK(cuMemGetAddressRange_v2(&base, &size, p) == 0);
        CHECK(base == DEV(b) && size >= 1 * MB && size <= 1 * MB + 64 * 1024);
        CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) == 0 && start == base);
        CHECK(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) == 0 && rsize == size);
        unsigned type = 0;
        int ordinal = -1;
        start = 0, rsize = 0;
        int attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
        void *data[] = {&start, &rsize, &type, &ordinal};
        CHECK(cuPointerGetAttributes(4, attrs, data, p) == 0);
        CHECK(start == base && rsize == size && type == CU_MEMORYTYPE_DEVICE && ordinal == dev);
        struct cudaPointerAttributes at;
        memset(&at, 0xff, sizeof at);
        CHECK(cudaPointerGetAttributes(&at, (char *)b + off) == 0);
        CHECK(at.type == cudaMemoryTypeDevice && at.device == dev && at.devicePointer == (char *)b + off);
    }
    CHECK(cudaFree(a) == 0 && cudaFree(b) == 0);
    /* Freed memory answers as freed memory, whatever a pool keeps cached there: no range, no
     * memory type, unregistered to the runtime. */
    CUdeviceptr p = DEV(b) + 100, base = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange_v2(&base, &size, p) != 0);
    unsigned type = 7;
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != 0);
    CHECK(type == 7); /* a failed query leaves the caller's answer as it was */
    CUdeviceptr start = 7;
    type = 7;
    int attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
    void *data[] = {&type, &start};
    CHECK(cuPointerGetAttributes(2, attrs, data, p) == 0 && type == 0 && start == 0);
    struct cudaPointerAttributes at;
    memset(&at, 0xff, sizeof at);
    CHECK(cudaPointerGetAttributes(&at, (char *)b + 100) == 0 && at.type == 0 && at.devicePointer == NULL);
    cudaGetLastError();
    /* So does a block freed after an IPC handle named it, which the pool keeps from reuse (its
     * neighbour live in the same segment). */
    void *kept = NULL, *named = NULL;
    CHECK(cudaMalloc(&kept, 1 * MB) == 0 && cudaMalloc(&named, 1 * MB) == 0);
    CUipcMemHandle handle;
    CHECK(cudaIpcGetMemHandle(&handle, named) == 0);
    CHECK(cudaFree(named) == 0);
    CHECK(cuMemGetAddressRange_v2(&base, &size, DEV(named)) != 0);
    type = 7;
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, DEV(named)) != 0 && type == 7);
    memset(&at, 0xff, sizeof at);
    CHECK(cudaPointerGetAttributes(&at, named) == 0 && at.type == 0 && at.devicePointer == NULL);
    CHECK(cudaFree(kept) == 0);
    cudaGetLastError();
}

/* ---------- memory the pool does not own, and stream-ordered frees ---------- */

static void async(void) {
    CUstream s = NULL;
    CHECK(cudaStreamCreate(&s) == 0);
    void *x = NULL;
    CHECK(cudaMallocAsync(&x, 8 * MB, s) == 0);
    CHECK(fakecuda_launch_memset(x, 0x55, 8 * MB) == 0);
    CHECK(cudaFreeAsync(x, s) == 0);
    CHECK(cudaStreamSynchronize(s) == 0);
    CHECK(byte_at(x) == -1); /* the runtime freed it after the stream's work */
    for (int by_driver = 0; by_driver < 2; by_driver++) {
        for (int i = 0; i < 10; i++) {
            void *a = NULL, *b = NULL;
            CHECK(cudaMalloc(&a, 8 * MB) == 0);
            CHECK(fakecuda_launch_memset(a, 0x77, 8 * MB) == 0); /* still queued at the free */
            CHECK((by_driver ? cuMemFreeAsync(DEV(a), s) : cudaFreeAsync(a, s)) == 0);
            CHECK(cudaMalloc(&b, 8 * MB) == 0);
            CHECK(byte_at(b) >= 0);
            memset(b, 0x11, 8 * MB); /* the new owner's data, before the queued kernel ran */
            CHECK(cudaDeviceSynchronize() == 0);
            CHECK(holds(b, 8 * MB, 0x11));
            CHECK(cudaFree(b) == 0);
        }
    }
    CHECK(cudaStreamDestroy(s) == 0);
}

/* Note [Streams that end] (src/device/pool/blocks.rs): a block freed on stream S with its kernel
 * still queued, then S destroyed and a new stream made, which the driver may give S's handle
 * (the stand-in's FAKECUDA_REUSE_STREAMS=1). A request on the new stream (tm_cuda_alloc, as the
 * package's CuPy and PyTorch hooks ask; cudaMallocAsync without it) must not get the block
 * before S's kernel is done: the new owner's data survives the device synchronization. */
static void stream_reused(void) {
    void *(*alloc_on)(long, int, void *) = (void *(*)(long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_alloc");
    void (*release)(void *, long, int, void *) = (void (*)(void *, long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_free");
    for (int i = 0; i < 10; i++) {
        CUstream s = NULL, fresh = NULL;
        CHECK(cudaStreamCreate(&s) == 0);
        void *a = NULL, *b = NULL;
        CHECK(cudaMalloc(&a, 8 * MB) == 0);
        CHECK(fakecuda_launch_memset(a, 0x77, 8 * MB) == 0); /* still queued at the free */
        CHECK(cudaFreeAsync(a, s) == 0);
        CHECK(cudaStreamDestroy(s) == 0);
        CHECK(cudaStreamCreate(&fresh) == 0);
        if (getenv("FAKECUDA_REUSE_STREAMS")) CHECK(fresh == s);
        if (alloc_on) b = alloc_on(8 * MB, 0, fresh);
        else CHECK(cudaMallocAsync(&b, 8 * MB, fresh) == 0);
        CHECK(b && byte_at(b) >= 0);
        memset(b, 0x11, 8 * MB); /* the new owner's data, before the queued kernel ran */
        CHECK(cudaDeviceSynchronize() == 0);
        CHECK(holds(b, 8 * MB, 0x11));
        if (release) release(b, 8 * MB, 0, fresh);
        else CHECK(cudaFreeAsync(b, fresh) == 0);
        CHECK(cudaStreamDestroy(fresh) == 0);
    }
}

/* Note [Per-thread streams] (src/route/cuda.rs): thread A frees a block with its kernel still
 * queued, on its own per-thread stream (cudaStreamPerThread through tm_cuda_free, or the null
 * stream of cuMemFreeAsync_ptsz); thread B then asks on its own per-thread stream (or the null
 * stream, a different one from A's per-thread stream) and must not get the block before A's
 * kernel is done: B's data survives the device synchronization. Without tm_cuda_alloc (no
 * preload), cudaMalloc stands in. */
#define PER_THREAD_STREAM ((void *)0x2)
static void *(*pt_alloc)(long, int, void *);
static void (*pt_release)(void *, long, int, void *);
static void *pt_block;
static int pt_ptsz;

static void *per_thread_a(void *unused) {
    (void)unused;
    CHECK(cudaFree(NULL) == 0);
    if (pt_alloc) pt_block = pt_alloc(8 * MB, 0, pt_ptsz ? NULL : PER_THREAD_STREAM);
    else CHECK(cudaMalloc(&pt_block, 8 * MB) == 0);
    CHECK(pt_block);
    CHECK(fakecuda_launch_memset(pt_block, 0x77, 8 * MB) == 0); /* still queued at the free */
    if (pt_ptsz) CHECK(cuMemFreeAsync_ptsz(DEV(pt_block), NULL) == 0);
    else if (pt_release) pt_release(pt_block, 8 * MB, 0, PER_THREAD_STREAM);
    else CHECK(cudaFree(pt_block) == 0);
    return NULL;
}

static void *per_thread_b(void *unused) {
    (void)unused;
    CHECK(cudaFree(NULL) == 0);
    void *q = NULL;
    if (pt_alloc) q = pt_alloc(8 * MB, 0, pt_ptsz ? NULL : PER_THREAD_STREAM);
    else CHECK(cudaMalloc(&q, 8 * MB) == 0);
    CHECK(q);
    memset(q, 0x11, 8 * MB); /* B's data, with nothing of A's ordered before it */
    CHECK(cudaDeviceSynchronize() == 0);
    CHECK(holds(q, 8 * MB, 0x11));
    if (pt_release) pt_release(q, 8 * MB, 0, pt_ptsz ? NULL : PER_THREAD_STREAM);
    else CHECK(cudaFree(q) == 0);
    return NULL;
}

static void per_thread_streams(void) {
    pt_alloc = (void *(*)(long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_alloc");
    pt_release = (void (*)(void *, long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_free");
    CHECK(cudaFree(NULL) == 0);
    for (pt_ptsz = 0; pt_ptsz < 2; pt_ptsz++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, per_thread_a, NULL) == 0 && pthread_join(t, NULL) == 0);
        CHECK(pthread_create(&t, NULL, per_thread_b, NULL) == 0 && pthread_join(t, NULL) == 0);
    }
}

/* Note [Graph captures under way] (src/device/device_layer/captures.rs): a segment the program
 * freed goes idle, and a block freed on a stream waits for a synchronization; then the program
 * captures a graph for longer than the release delay, in the global mode (as torch.cuda.graph
 * does) or the relaxed one, allocating in it (the stand-in lets the capturing thread do so in
 * the relaxed mode; the global mode's capture, as PyTorch's, makes its own thread relaxed around
 * the allocation). Nothing may synchronize the device meanwhile: the capture must end whole.
 * After it, the idle memory goes back to the driver. `capture-relaxed` captures in the relaxed
 * mode. */
static void capture(const char *scenario) {
    const int relaxed_mode = 2;
    int mode = !strcmp(scenario, "capture-relaxed") ? relaxed_mode : 0;
    void *p = NULL, *q = NULL, *r = NULL;
    CHECK(cudaMalloc(&p, 64 * MB) == 0);
    CHECK(cudaFree(p) == 0);
    CUstream s = NULL, other = NULL;
    CHECK(cudaStreamCreate(&s) == 0 && cudaStreamCreate(&other) == 0);
    CHECK(cudaMalloc(&q, 96 * MB) == 0); /* larger than p: only q would serve r */
    /* Freed on a stream as the package's hooks free (tm_cuda_free), else as the runtime does. */
    void (*release)(void *, long, int, void *) = (void (*)(void *, long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_free");
    if (release) release(q, 96 * MB, 0, other);
    else CHECK(cudaFreeAsync(q, other) == 0);
    CHECK(cuStreamBeginCapture_v2(s, mode) == 0);
    int was = relaxed_mode;
    CHECK(cuThreadExchangeStreamCaptureMode(&was) == 0);
    int allocated = cudaMalloc(&r, 96 * MB);
    CHECK(cuThreadExchangeStreamCaptureMode(&was) == 0);
    if (allocated != 0) printf("allocation in the capture failed (%d)\n", allocated);
    CHECK(allocated == 0);
    usleep(400 * 1000);
    void *graph = NULL;
    int rc = cuStreamEndCapture(s, &graph);
    if (rc != 0) printf("capture invalidated (%d)\n", rc);
    CHECK(rc == 0 && graph);
    CHECK(cudaFree(r) == 0);
    CHECK(cudaStreamDestroy(s) == 0 && cudaStreamDestroy(other) == 0);
    usleep(400 * 1000); /* the idle releases come after the capture */
}

/* Note [Graph captures under way]: a cudaMalloc in a capture from a thread in the global mode
 * (`capture-global-malloc`: its own capture, global; `capture-other-thread`: another thread's
 * global capture) is one the runtime refuses (cudaErrorStreamCaptureUnsupported), ending the
 * capture (its end: invalidated). The block freed before it, cached by us, served it: the
 * allocation and the capture succeeded where they fail alone. `capture-thread-local`: another
 * thread's capture in the thread-local mode refuses nothing here: the allocation succeeds, the
 * capture ends whole. Prints the answers, for the test to compare with the runtime alone. */
static CUstream capture_stream;
static int capture_mode_begun;
static volatile int capture_begun, capture_may_end;
static void *capture_elsewhere(void *arg) {
    (void)arg;
    CHECK(cuStreamBeginCapture_v2(capture_stream, capture_mode_begun) == 0);
    capture_begun = 1;
    while (!capture_may_end) usleep(1000);
    void *graph = NULL;
    return (void *)(intptr_t)cuStreamEndCapture(capture_stream, &graph);
}

static void capture_malloc(const char *scenario) {
    void *p = NULL, *r = NULL, *graph = NULL;
    CHECK(cudaMalloc(&p, 64 * MB) == 0);
    CHECK(cudaFree(p) == 0);
    CHECK(cudaStreamCreate(&capture_stream) == 0);
    int allocated, ended;
    if (!strcmp(scenario, "capture-global-malloc")) {
        CHECK(cuStreamBeginCapture_v2(capture_stream, 0) == 0);
        allocated = cudaMalloc(&r, 64 * MB);
        ended = cuStreamEndCapture(capture_stream, &graph);
    } else {
        capture_mode_begun = !strcmp(scenario, "capture-thread-local") ? 1 : 0;
        pthread_t t;
        CHECK(pthread_create(&t, NULL, capture_elsewhere, NULL) == 0);
        while (!capture_begun) usleep(1000);
        allocated = cudaMalloc(&r, 64 * MB);
        capture_may_end = 1;
        void *rc = NULL;
        CHECK(pthread_join(t, &rc) == 0);
        ended = (int)(intptr_t)rc;
    }
    printf("%s: allocation %d, capture's end %d\n", scenario, allocated, ended);
    if (allocated == 0) CHECK(cudaFree(r) == 0);
    CHECK(cudaStreamDestroy(capture_stream) == 0);
}

/* Note [Whole idle segments] (src/device/pool/blocks.rs): 100 MiB freed, a small block (1 or 3
 * MiB, `kept-small-1`, `kept-small-3`) asked and kept, then 1000 MiB of a 1 GiB device. Alone
 * the free gave the 100 MiB back. The pool carved the small block from the idle segment, which
 * then could not go back, and the last request failed with out of memory (the cuda2 hunter). */
/* `kept-left-1`, `kept-left-4`: 60 MiB asked first (half the segment or more may carve it),
 * then the small block from what is left, then the 60 MiB freed: the small block pinned the
 * whole segment the same way (the soak hunter). */
static void kept_small(const char *scenario) {
    int leftover = !strncmp(scenario, "kept-left-", 10);
    size_t small = (size_t)atoi(scenario + strlen(leftover ? "kept-left-" : "kept-small-")) * MB;
    void *big = NULL, *kept = NULL, *most = NULL, *mid = NULL;
    CHECK(cudaMalloc(&big, 100 * MB) == 0);
    CHECK(cudaFree(big) == 0);
    if (leftover) CHECK(cudaMalloc(&mid, 60 * MB) == 0);
    CHECK(cudaMalloc(&kept, small) == 0);
    if (leftover) CHECK(cudaFree(mid) == 0 && cudaDeviceSynchronize() == 0);
    int rc = cudaMalloc(&most, 1000 * MB);
    if (rc != 0) printf("1000 MiB refused (%d)\n", rc);
    CHECK(rc == 0);
    CHECK(cudaFree(most) == 0 && cudaFree(kept) == 0);
}

/* Note [Graph captures under way]: pinned memory freed while a graph is captured, by the
 * capturing thread or another one (`capture-pinned-free-same`, `-other`), in the global mode:
 * alone the free and the capture's end both succeed. Our free synchronized the device first (a
 * pinned block may still be copied from), which invalidates the capture: the free answered 900
 * and the end 901 (the cuda2 hunter). */
static void *free_pinned(void *p) {
    return (void *)(intptr_t)cudaFreeHost(p);
}

static void capture_pinned_free(const char *scenario) {
    void *pinned[3] = {0}, *graph = NULL;
    CUstream s = NULL;
    CHECK(cudaStreamCreate(&s) == 0);
    for (int k = 0; k < 3; k++) CHECK(cudaMallocHost(&pinned[k], (k + 1) * MB) == 0);
    CHECK(cudaFreeHost(pinned[2]) == 0); /* one block cached before the capture */
    CHECK(cuStreamBeginCapture_v2(s, 0) == 0);
    int freed[2];
    for (int k = 0; k < 2; k++) {
        if (!strcmp(scenario, "capture-pinned-free-other")) {
            pthread_t t;
            void *rc = NULL;
            CHECK(pthread_create(&t, NULL, free_pinned, pinned[k]) == 0 && pthread_join(t, &rc) == 0);
            freed[k] = (int)(intptr_t)rc;
        } else {
            freed[k] = cudaFreeHost(pinned[k]);
        }
    }
    int rc = cuStreamEndCapture(s, &graph);
    if (freed[0] || freed[1]) printf("pinned free in the capture failed (%d, %d)\n", freed[0], freed[1]);
    if (rc != 0) printf("capture invalidated (%d)\n", rc);
    CHECK(freed[0] == 0 && freed[1] == 0 && rc == 0 && graph);
    void *again = NULL;
    CHECK(cudaMallocHost(&again, 2 * MB) == 0);
    memset(again, 0x5a, 2 * MB);
    CHECK(cudaFreeHost(again) == 0);
    CHECK(cudaStreamDestroy(s) == 0);
}

/* Note [Graph captures under way]: 600 MiB freed before a capture (of a 1 GiB device), then
 * 700 MiB asked in it, in the thread-local or the relaxed mode (`capture-after-free-MODE`).
 * Alone, the free gave the memory back; the pool kept it cached through the capture, and the
 * allocation failed with out of memory (the cudart hunter's find). */
static void capture_after_free(const char *scenario) {
    int mode = !strcmp(scenario, "capture-after-free-relaxed") ? 2 : 1;
    void *p = NULL, *q = NULL, *graph = NULL;
    CUstream s = NULL;
    CHECK(cudaStreamCreate(&s) == 0);
    CHECK(cudaMalloc(&p, 600 * MB) == 0);
    CHECK(cudaFree(p) == 0);
    CHECK(cuStreamBeginCapture_v2(s, mode) == 0);
    int allocated = cudaMalloc(&q, 700 * MB);
    if (allocated != 0) printf("allocation in the capture failed (%d)\n", allocated);
    int rc = cuStreamEndCapture(s, &graph);
    if (rc != 0) printf("capture invalidated (%d)\n", rc);
    CHECK(allocated == 0 && rc == 0 && graph);
    CHECK(cudaFree(q) == 0);
    CHECK(cudaStreamDestroy(s) == 0);
}

/* Note [Pinned memory answers as asked] (src/device/pinned/cache.rs): a pinned block of 5,000
 * bytes answers pointer queries with its own range, a pointer past it is unknown memory, and so
 * is the block after cudaFreeHost (our cache keeps it pinned); twice, the second time on the
 * block the cache kept. The pinned queries (cuMemHostGetDevicePointer_v2, cuMemHostGetFlags)
 * answer so too: they answered 0 for the freed block and past its end (the cuda2 hunter). */
int cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned);
int cuMemHostGetFlags(unsigned *, void *);

static int pinned_known(void *p) {
    CUdeviceptr d = 0;
    unsigned flags = 0;
    int a = cuMemHostGetDevicePointer_v2(&d, p, 0), b = cuMemHostGetFlags(&flags, p);
    CHECK((a == 0) == (b == 0));
    CHECK(a != 0 || d == DEV(p));
    return a == 0;
}

static void pinned_range(void) {
    for (int round = 0; round < 2; round++) {
        char *h = NULL;
        CHECK(cudaHostAlloc((void **)&h, 5000, 0) == 0 && h);
        CUdeviceptr base = 0;
        size_t size = 0, rsize = 0;
        CHECK(cuMemGetAddressRange_v2(&base, &size, DEV(h + 10)) == 0 && base == DEV(h) && size == 5000);
        CHECK(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, DEV(h + 4999)) == 0 && rsize == 5000);
        struct cudaPointerAttributes at;
        CHECK(cudaPointerGetAttributes(&at, h) == 0 && at.type == cudaMemoryTypeHost);
        CHECK(pinned_known(h) && pinned_known(h + 4999));
        for (int past = 5000; past <= 8191; past += 3191) {
            CHECK(!pinned_known(h + past));
            CHECK(cuMemGetAddressRange_v2(&base, &size, DEV(h + past)) == CUDA_ERROR_NOT_FOUND);
            CHECK(cudaPointerGetAttributes(&at, h + past) == 0 && at.type == cudaMemoryTypeUnregistered);
            cudaGetLastError();
        }
        CHECK(cudaFreeHost(h) == 0);
        CHECK(!pinned_known(h) && !pinned_known(h + 10));
        CHECK(cuMemGetAddressRange_v2(&base, &size, DEV(h)) == CUDA_ERROR_NOT_FOUND);
        CHECK(cudaPointerGetAttributes(&at, h) == 0 && at.type == cudaMemoryTypeUnregistered);
        cudaGetLastError();
    }
}

/* A thread's first runtime call is a free or an IPC handle of a pooled block; the runtime binds
 * the device's primary context first, and the thread's driver calls after it count on that
 * (runtime and driver API mixed, as the runtime's own docs allow). */
int cuCtxGetCurrent(CUcontext *);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
static void *first_block;
static int first_kind;

static void *first_call(void *arg) {
    (void)arg;
    CUipcMemHandle handle;
    int rc = first_kind == 0 ? cudaFree(first_block)
           : first_kind == 1 ? cudaFreeAsync(first_block, NULL)
           : cudaIpcGetMemHandle(&handle, first_block);
    CUcontext c = NULL;
    CUdeviceptr d = 0;
    CHECK(cuCtxGetCurrent(&c) == 0);
    int alloc_rc = cuMemAlloc_v2(&d, 1 * MB);
    if (!c || alloc_rc != 0) printf("first call %d: rc %d, context %p, cuMemAlloc %d\n", first_kind, rc, (void *)c, alloc_rc);
    CHECK(rc == 0 && c && alloc_rc == 0);
    CHECK(cuMemFree_v2(d) == 0);
    return NULL;
}

static void first_calls(void) {
    for (first_kind = 0; first_kind < 3; first_kind++) {
        CHECK(cudaMalloc(&first_block, 1 * MB) == 0);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, first_call, NULL) == 0 && pthread_join(t, NULL) == 0);
        if (first_kind == 2) CHECK(cudaFree(first_block) == 0);
    }
}

/* Note [Idle blocks freed on streams] (src/device/device_layer/give_back.rs): blocks freed on a
 * stream (tm_cuda_free, as PyTorch's and CuPy's hooks free, and cudaFreeAsync), their kernels
 * queued, then nothing: past the release delay the driver has the memory back, and the kernels'
 * work was done first. Without tm_cuda_alloc (no preload), cudaMalloc and cudaFree. */
static void stream_idle(void) {
    void *(*alloc)(long, int, void *) = (void *(*)(long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_alloc");
    void (*release)(void *, long, int, void *) = (void (*)(void *, long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_free");
    CHECK(cudaFree(NULL) == 0);
    struct fakecuda_counters c;
    fakecuda_get_counters(&c);
    uint64_t before = c.used[0];
    CUstream s = NULL;
    CHECK(cudaStreamCreate(&s) == 0);
    void *p[3];
    for (int i = 0; i < 3; i++) {
        if (alloc) p[i] = alloc(200 * MB, 0, s);
        else CHECK(cudaMalloc(&p[i], 200 * MB) == 0);
        CHECK(p[i]);
        CHECK(fakecuda_launch_memset(p[i], 0x20 + i, 200 * MB) == 0);
    }
    for (int i = 0; i < 2; i++) {
        if (release) release(p[i], 200 * MB, 0, s);
        else CHECK(cudaFree(p[i]) == 0);
    }
    CHECK(cudaFreeAsync(p[2], s) == 0);
    if (!alloc) CHECK(cudaStreamSynchronize(s) == 0); /* alone, the runtime frees it after the stream's work */
    /* The release delay is 50 ms here; the stand-in runs the queued kernels (600 MiB of memset)
     * at the synchronization, which takes it most of a second on a loaded machine. */
    for (int waited = 0; waited < 200; waited++) {
        fakecuda_get_counters(&c);
        if (c.used[0] <= before) break;
        usleep(50 * 1000);
    }
    if (c.used[0] > before) printf("driver still holds %lu MiB\n", (unsigned long)((c.used[0] - before) / MB));
    CHECK(c.used[0] <= before);
    CHECK(cudaStreamDestroy(s) == 0);
}

static void managed(void) {
    void *m = NULL;
    CHECK(cudaMallocManaged(&m, 4 * MB, 1) == 0);
    struct cudaPointerAttributes at;
    CHECK(cudaPointerGetAttributes(&at, m) == 0 && at.type == cudaMemoryTypeManaged);
    unsigned is_managed = 0;
    CHECK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, DEV(m)) == 0 && is_managed == 1);
    memset(m, 0x12, 4 * MB);
    kernel_works(m, 4 * MB, 0x34);
    CHECK(cudaFree(m) == 0);
    CHECK(byte_at(m) == -1); /* freed by the runtime */
}

static void vmm(void) {
    CHECK(cudaSetDevice(0) == 0 && cuInit(0) == 0);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;          /* CU_MEM_ALLOCATION_TYPE_PINNED */
    prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
    prop.location.id = 0;
    size_t gran = 0, size = 4 * MB;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, 0) == 0 && gran && size % gran == 0);
    unsigned long long h = 0;
    CUdeviceptr va = 0, base = 0;
    CHECK(cuMemCreate(&h, size, &prop, 0) == 0);
    CHECK(cuMemAddressReserve(&va, size, 0, 0, 0) == 0 && va);
    CHECK(cuMemMap(va, size, 0, h, 0) == 0);
    CUmemAccessDesc desc = {{1, 0}, 3 /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */};
    CHECK(cuMemSetAccess(va, size, &desc, 1) == 0);
    kernel_works((void *)(uintptr_t)va, size, 0x71);
    size_t got = 0;
    CHECK(cuMemGetAddressRange_v2(&base, &got, va + 100) == 0 && base == va && got == size);
    CHECK(cuMemUnmap(va, size) == 0);
    CHECK(cuMemGetAddressRange_v2(&base, &got, va) != 0); /* nothing mapped there now */
    CHECK(cuMemRelease(h) == 0);
    CHECK(cuMemAddressFree(va, size) == 0);
}

/* Against the PLT_CALLS runtime: its cudaHostAlloc calls cudaMallocHost and its cudaMalloc calls
 * cudaMemGetInfo through the PLT, where an interposer's own entry points answer. */
static void reentrant(void) {
    for (int i = 0; i < 20; i++) {
        void *p = NULL, *q = NULL;
        CHECK(cudaMallocHost(&p, 100 * MB) == 0 && p);
        ((char *)p)[0] = ((char *)p)[100 * MB - 1] = (char)i; /* usable at both ends */
        CHECK(cudaFreeHost(p) == 0);
        CHECK(cudaHostAlloc(&q, 100 * MB, 0) == 0 && q);
        ((char *)q)[0] = ((char *)q)[100 * MB - 1] = (char)i;
        CHECK(cudaFreeHost(q) == 0);
    }
    for (int i = 0; i < 20; i++) {
        void *p = NULL;
        CHECK(cudaMalloc(&p, 16 * MB) == 0 && p);
        kernel_works(p, 1 * MB, i);
        CHECK(cudaFree(p) == 0);
    }
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    const char *s = argv[1];
    if (!strcmp(s, "ipc-child")) {
        CHECK(argc == 7);
        return ipc_child(argv);
    }
    if (!strcmp(s, "reset")) reset_scenario(0, 0);
    else if (!strcmp(s, "reset-live")) reset_scenario(0, 1);
    else if (!strcmp(s, "primary-reset")) reset_scenario(1, 0);
    else if (!strcmp(s, "primary-reset-live")) reset_scenario(1, 1);
    else if (!strcmp(s, "reset-entered")) reset_entered();
    else if (!strcmp(s, "ctx-destroy")) ctx_destroy();
    else if (!strcmp(s, "driver-free")) driver_free();
    else if (!strcmp(s, "ipc")) ipc(0, 1 * MB);
    else if (!strcmp(s, "ipc-driver")) ipc(1, 1 * MB);
    else if (!strcmp(s, "ipc-big")) ipc(0, 64 * MB), ipc(1, 64 * MB);
    else if (!strcmp(s, "ipc-after-free")) ipc_after_free();
    else if (!strcmp(s, "range")) range_on(0), range_on(1);
    else if (!strcmp(s, "async")) async();
    else if (!strcmp(s, "per-thread-streams")) per_thread_streams();
    else if (!strcmp(s, "stream-reused")) stream_reused();
    else if (!strcmp(s, "capture") || !strcmp(s, "capture-relaxed")) capture(s);
    else if (!strncmp(s, "capture-after-free-", 19)) capture_after_free(s);
    else if (!strncmp(s, "capture-pinned-free-", 20)) capture_pinned_free(s);
    else if (!strcmp(s, "capture-global-malloc") || !strcmp(s, "capture-other-thread") || !strcmp(s, "capture-thread-local")) capture_malloc(s);
    else if (!strncmp(s, "kept-small-", 11) || !strncmp(s, "kept-left-", 10)) kept_small(s);
    else if (!strcmp(s, "first-calls")) first_calls();
    else if (!strcmp(s, "pinned-range")) pinned_range();
    else if (!strcmp(s, "stream-idle")) stream_idle();
    else if (!strcmp(s, "managed")) managed();
    else if (!strcmp(s, "vmm")) vmm();
    else if (!strcmp(s, "reentrant")) reentrant();
    else CHECK(!"unknown scenario");
    printf("%s ok\n", s);
    return 0;
}
