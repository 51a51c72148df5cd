/* SIMULATOR: a stand-in CUDA driver (libcuda.so.1) for tests on machines without a GPU; not NVIDIA's driver. */
/* It models only what the tests need, with the driver API's real signatures and codes: devices
 * backed by host memory with a fixed capacity (FAKECUDA_DEVICES devices, default 2;
 * FAKECUDA_DEVICE_MEM bytes each, default 1 GiB), primary and user contexts whose reset or
 * destruction kills every allocation they own (the primary context's handle stays the same, as
 * NVIDIA's does), a per-thread context stack, one memfd per allocation so IPC handles can name a
 * whole allocation across processes, pointer queries, stream-ordered frees, managed memory, a VMM
 * subset as NVIDIA documents it, and "kernels" (fakecuda_launch_memset) queued until the next synchronization, so a pool
 * that reuses a block before the work on it finished, or hands out a block of a dead context, is
 * caught. Knobs to widen races: FAKECUDA_ALLOC_DELAY_US makes every cuMemAlloc take that long
 * (outside the lock, as on a busy GPU); FAKECUDA_REUSE_STREAMS=1 gives a new stream the handle of
 * the most recently destroyed one; FAKECUDA_REUSE_CONTEXTS=1 gives a new context the handle
 * of the most recently destroyed one; FAKECUDA_SHARED_MEM=PATH makes the processes that name PATH
 * share the devices' memory, as processes share a GPU; FAKECUDA_RESET_KEEPS_REFS=1 makes a primary
 * context reset keep its references, as NVIDIA documents ("resetting the primary context does not
 * release it": each holder releases its own after), where by default a reset ends them all. Thread-safe with one mutex; static tables
 * only (no malloc).
 * A forked child of a process that initialized the driver is answered as NVIDIA's driver answers
 * it: every call, cuInit included, fails with CUDA_ERROR_NOT_INITIALIZED (3).
 * What NVIDIA's real runtime (and PyTorch over it) needs beyond this lives in fakecuda_runtime.c,
 * compiled into this file: private tables, copies, events, attributes, stubs for the rest. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct fake_ctx *CUcontext;
typedef void *CUstream;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef int CUdriverProcAddressQueryResult;

enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_ILLEGAL_ADDRESS = 700, CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_SUPPORTED = 801, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
};
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_UNIFIED = 4 };
enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3, CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
    CU_POINTER_ATTRIBUTE_BUFFER_ID = 7, CU_POINTER_ATTRIBUTE_IS_MANAGED = 8, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11, CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    CU_POINTER_ATTRIBUTE_MAPPED = 13,
};
enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1 };

#define MAX_DEV 4
#define MAX_CTX 256 /* slots 0..MAX_DEV-1 are the primary contexts */
#define MAX_ALLOC 4096
#define MAX_QUEUED 4096
#define STACK_DEPTH 32
#define IPC_MAGIC 0x46414b4543554441ULL /* "FAKECUDA" */

enum ctx_state { CTX_FREE, CTX_LIVE, CTX_INACTIVE /* primary, not retained or reset */, CTX_DESTROYED };
struct fake_ctx { int state; int dev; int primary; int refs; };

enum kind { K_NONE, K_DEVICE, K_ASYNC, K_MANAGED, K_HOST, K_IPC, K_VMM_HANDLE, K_VMM_RESERVE, K_VMM_MAP };
struct alloc {
    int kind;
    int fd;          /* the memfd (device, async, managed, host, VMM handle); -1 otherwise */
    int dev;
    int counted;     /* counts against used[dev] and lies in the device's address range */
    CUcontext ctx;   /* owner; NULL for VMM */
    uintptr_t base;  /* for K_VMM_HANDLE: 0 (not mapped by itself) */
    size_t size;
    uint64_t serial; /* tells a reused slot from the allocation a queued op named */
    int freeing;     /* a stream-ordered free is queued: a second free of it is refused */
    int handle;      /* K_VMM_MAP: the slot of the handle it maps, plus one */
    int maps;        /* K_VMM_HANDLE: its mappings; released while mapped, it lives until the last goes */
    int released;    /* K_VMM_HANDLE: cuMemRelease came (the handle is dead to the program) */
    int access;      /* K_VMM_MAP: the devices cuMemSetAccess made it read-write for, a bit each */
    int shareable;   /* K_VMM_HANDLE: created with requestedHandleTypes = POSIX file descriptor */
};
struct op { int is_free; int slot; uint64_t serial; unsigned char *p; size_t n; int value; };
struct ipc_handle { uint64_t magic; int32_t pid; int32_t fd; uint64_t size; uint64_t ino; uint64_t dev; };

struct fakecuda_counters { uint64_t mallocs, frees, syncs, host_allocs, host_frees; uint64_t used[MAX_DEV]; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_ctx ctxs[MAX_CTX];
static struct alloc allocs[MAX_ALLOC];
static struct op queue[MAX_QUEUED];
static int nqueued;
static uint64_t next_serial = 1;
static struct fakecuda_counters counters;
/* Virtual memory calls that create, map, unmap or release memory (fakecuda_vmm_calls). */
static uint64_t vmm_calls;
static int initialized, ndevices;
/* The driver's teardown at exit (a destructor, run after the exit handlers, as NVIDIA's libcuda
 * tears down): any call after it is the caller's bug, and the stand-in ends the process with exit
 * code 86 after one line naming the call. Every entry point reads `initialized` through here. */
static int torn_down;
__attribute__((destructor)) static void teardown(void) { __atomic_store_n(&torn_down, 1, __ATOMIC_SEQ_CST); }
static int *alive(const char *call) {
    if (__atomic_load_n(&torn_down, __ATOMIC_SEQ_CST)) {
        char line[160];
        int n = snprintf(line, sizeof line, "fakecuda: %s after the driver's teardown\n", call);
        if (write(2, line, n > 0 ? (size_t)n : 0) < 0) _exit(86);
        _exit(86);
    }
    return &initialized;
}
#define initialized (*alive(__func__))
static unsigned alloc_delay_us;
static int reuse_contexts;
static int reuse_streams;
static CUstream last_destroyed_stream;
static int reset_keeps_refs;
static CUcontext last_destroyed;
static size_t capacity;
static unsigned long next_stream = 1;
/* Each device's allocations lie in its own reserved address range, as under unified addressing:
 * an address freed on one device is never handed out by another. */
static uintptr_t region[MAX_DEV];
static size_t region_size;
#define PLACE_ALIGN (2UL << 20)
static __thread __attribute__((tls_model("initial-exec"))) CUcontext stack[STACK_DEPTH]; /* no malloc in __tls_get_addr */
static __thread __attribute__((tls_model("initial-exec"))) int depth;

/* FAKECUDA_SHARED_MEM=PATH: the devices' used bytes live in the file PATH, shared by every
 * process that names it, as several processes share one GPU's memory; counters.used stays this
 * process's own. (A real driver also frees a process's memory when it ends; this one does not:
 * a test's processes free what they took.) */
static uint64_t *shared_used;

static uint64_t device_used(int d) {
    return shared_used ? __atomic_load_n(&shared_used[d], __ATOMIC_SEQ_CST) : counters.used[d];
}

/* Takes size bytes of device d's memory: 0, or -1 when they do not fit. */
static int take_memory(int d, size_t size) {
    if (size > capacity) return -1;
    if (shared_used) {
        if (__atomic_add_fetch(&shared_used[d], size, __ATOMIC_SEQ_CST) > capacity) {
            __atomic_sub_fetch(&shared_used[d], size, __ATOMIC_SEQ_CST);
            return -1;
        }
    } else if (counters.used[d] > capacity - size) {
        return -1;
    }
    counters.used[d] += size;
    return 0;
}

static void give_memory(int d, size_t size) {
    counters.used[d] -= size;
    if (shared_used) __atomic_sub_fetch(&shared_used[d], size, __ATOMIC_SEQ_CST);
}

/* ---------- configuration and helpers (callers hold the lock unless said otherwise) ---------- */

static void configure(void) {
    if (ndevices) return;
    const char *v = getenv("FAKECUDA_DEVICES");
    int n = v ? atoi(v) : 2;
    ndevices = n < 1 ? 1 : n > MAX_DEV ? MAX_DEV : n;
    v = getenv("FAKECUDA_DEVICE_MEM");
    capacity = v ? strtoull(v, NULL, 10) : (1UL << 30);
    v = getenv("FAKECUDA_ALLOC_DELAY_US");
    alloc_delay_us = v ? (unsigned)strtoul(v, NULL, 10) : 0;
    v = getenv("FAKECUDA_REUSE_CONTEXTS");
    reuse_contexts = v && *v == '1';
    v = getenv("FAKECUDA_REUSE_STREAMS");
    reuse_streams = v && *v == '1';
    v = getenv("FAKECUDA_RESET_KEEPS_REFS");
    reset_keeps_refs = v && *v == '1';
    v = getenv("FAKECUDA_SHARED_MEM");
    if (v && *v) {
        int fd = open(v, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        void *m = fd < 0 || ftruncate(fd, MAX_DEV * sizeof(uint64_t)) != 0 ? MAP_FAILED
                  : mmap(NULL, MAX_DEV * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd >= 0) close(fd);
        if (m != MAP_FAILED) shared_used = m;
    }
    for (int d = 0; d < MAX_DEV; d++) ctxs[d] = (struct fake_ctx){CTX_INACTIVE, d, 1, 0};
    region_size = ((2 * capacity + (1UL << 30)) + PLACE_ALIGN - 1) & ~(PLACE_ALIGN - 1);
    for (int d = 0; d < ndevices; d++) {
        void *r = mmap(NULL, region_size + PLACE_ALIGN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        region[d] = r == MAP_FAILED ? 0 : ((uintptr_t)r + PLACE_ALIGN - 1) & ~(PLACE_ALIGN - 1);
    }
}

static size_t footprint(size_t size) { return (size + PLACE_ALIGN - 1) & ~(PLACE_ALIGN - 1); }

/* First fit in the device's range; 0 when it is full. */
static uintptr_t place(int dev, size_t size) {
    if (!region[dev] || size > region_size) return 0;
    uintptr_t cand = region[dev], foot = footprint(size);
again:
    if (cand + foot > region[dev] + region_size) return 0;
    for (int i = 0; i < MAX_ALLOC; i++) {
        struct alloc *a = &allocs[i];
        if (a->kind != K_NONE && a->counted && a->base && a->dev == dev && a->base < cand + foot && cand < a->base + footprint(a->size)) {
            cand = a->base + footprint(a->size);
            goto again;
        }
    }
    return cand;
}

static int known_ctx(CUcontext c) {
    return c >= &ctxs[0] && c < &ctxs[MAX_CTX] && ((uintptr_t)c - (uintptr_t)ctxs) % sizeof *c == 0 && c->state != CTX_FREE;
}

static CUresult usable(CUcontext c) {
    if (!c || !known_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (c->state == CTX_DESTROYED || c->state == CTX_INACTIVE) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_SUCCESS;
}

static CUcontext current(void) { return depth ? stack[depth - 1] : NULL; }

/* The current context when it can be used; the error to return otherwise. Takes no lock: the
 * state it reads is written under the lock and read again under it by the callers that act. */
static CUresult need_ctx(void) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return usable(current());
}

static int new_memfd(size_t size) {
    int fd = memfd_create("fakecuda", MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (ftruncate(fd, (off_t)size) != 0) { close(fd); return -1; }
    return fd;
}

static int free_slot(void) {
    for (int i = 0; i < MAX_ALLOC; i++) if (allocs[i].kind == K_NONE) return i;
    return -1;
}

/* The live allocation (of the kinds in mask) whose range holds p, or -1. */
#define M(k) (1u << (k))
#define MEMORY (M(K_DEVICE) | M(K_ASYNC) | M(K_MANAGED) | M(K_HOST) | M(K_IPC) | M(K_VMM_MAP))
static int find_containing(uintptr_t p, unsigned mask) {
    for (int i = 0; i < MAX_ALLOC; i++)
        if ((mask & M(allocs[i].kind)) && allocs[i].base && p >= allocs[i].base && p - allocs[i].base < allocs[i].size) return i;
    return -1;
}
static int find_base(uintptr_t p, unsigned mask) {
    for (int i = 0; i < MAX_ALLOC; i++)
        if ((mask & M(allocs[i].kind)) && allocs[i].base && allocs[i].base == p) return i;
    return -1;
}

static void release_slot(int i) {
    struct alloc *a = &allocs[i];
    if (a->base && a->counted) /* back to a reservation: a dead pointer faults, the range stays the device's */
        mmap((void *)a->base, a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    else if (a->base && a->kind != K_VMM_MAP) munmap((void *)a->base, a->size);
    if (a->fd >= 0) close(a->fd);
    if (a->counted) give_memory(a->dev, a->size);
    memset(a, 0, sizeof *a);
    a->fd = -1;
}

static void cls_forget(CUcontext c);      /* fakecuda_runtime.c: the context's local storage */
static void cls_run_destructors(void);    /* goes; its destructors run after the lock */

/* Kills every allocation owned by c: unmapped and forgotten, as a reset or destroy does. */
static void kill_allocations(CUcontext c) {
    for (int i = 0; i < MAX_ALLOC; i++)
        if (allocs[i].kind != K_NONE && allocs[i].ctx == c) release_slot(i);
    cls_forget(c);
}

static void run_queue(void) {
    for (int i = 0; i < nqueued; i++) {
        struct op *o = &queue[i];
        struct alloc *a = &allocs[o->slot];
        if (a->kind == K_NONE || a->serial != o->serial) continue; /* its allocation died meanwhile */
        if (o->is_free) {
            if (a->kind == K_DEVICE) counters.frees++;
            release_slot(o->slot);
        } else {
            memset(o->p, o->value, o->n);
        }
    }
    nqueued = 0;
}

static void synchronize(void) {
    run_queue();
    counters.syncs++;
}

static void enqueue(struct op o) {
    if (nqueued == MAX_QUEUED) run_queue(); /* a full queue blocks the launcher until work drains */
    queue[nqueued++] = o;
}

/* Maps a fresh memfd-backed allocation of kind k in the current context. */
/* ----- stream capture, as far as another thread's calls go: a capture begun in the global mode
 * makes the calls CUDA calls unsafe (cuMemAlloc, cuMemFree, cuCtxSynchronize) of every thread in
 * the global mode fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and invalidates the capture
 * (its end answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED); a thread in the relaxed mode
 * (cuThreadExchangeStreamCaptureMode) may make them. A synchronization of the context while any
 * capture is under way, in any mode, is invalid (CUDA's programming guide, "Prohibited and
 * Unhandled Operations") and fails and invalidates the same way: cuCtxSynchronize, and
 * cuMemFree, which synchronizes here (modelled so: whether a real GPU's cuMemFree counts as one
 * under the relaxed mode is not checked). ----- */
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_STREAM_CAPTURE_MODE_RELAXED 2
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
static __thread __attribute__((tls_model("initial-exec"))) int capture_mode_of_thread;
static int global_captures, captures, capture_invalidated; /* under `lock` */

/* `synchronizes`: the call synchronizes the context (forbidden during any capture). */
static CUresult capture_forbids_call(int synchronizes) {
    int relaxed = capture_mode_of_thread == CU_STREAM_CAPTURE_MODE_RELAXED;
    pthread_mutex_lock(&lock);
    int forbidden = (synchronizes && captures > 0) || (!relaxed && global_captures > 0);
    if (forbidden) capture_invalidated = 1;
    pthread_mutex_unlock(&lock);
    return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}
static CUresult capture_forbids(void) { return capture_forbids_call(0); }
static CUresult capture_forbids_sync(void) { return capture_forbids_call(1); }

static CUresult alloc_mem(CUdeviceptr *out, size_t size, int k) {
    if (!out || !size) return CUDA_ERROR_INVALID_VALUE;
    CUresult e = need_ctx();
    if (e) return e;
    if (k == K_DEVICE && alloc_delay_us) usleep(alloc_delay_us);
    pthread_mutex_lock(&lock);
    CUcontext c = current();
    if ((e = usable(c))) goto out;
    int counted = k != K_HOST;
    if (counted && take_memory(c->dev, size)) { e = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    int slot = free_slot();
    int fd = slot < 0 ? -1 : new_memfd(size);
    uintptr_t at = counted ? place(c->dev, size) : 0;
    void *p = fd < 0 || (counted && !at) ? MAP_FAILED
              : mmap((void *)at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (counted ? MAP_FIXED : 0), fd, 0);
    if (p == MAP_FAILED) {
        if (fd >= 0) close(fd);
        if (counted) give_memory(c->dev, size);
        e = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    allocs[slot] = (struct alloc){k, fd, c->dev, counted, c, (uintptr_t)p, size, next_serial++};
    if (k == K_DEVICE) counters.mallocs++;
    if (k == K_HOST) counters.host_allocs++;
    *out = (CUdeviceptr)(uintptr_t)p;
out:
    pthread_mutex_unlock(&lock);
    return e;
}

/* ---------- static implementations (the table cuGetProcAddress answers with) ---------- */

/* Set in a forked child of a process that had initialized the driver: nothing works there. */
static int forked_after_init;

static void child_after_fork(void) {
    if (initialized) forked_after_init = 1;
    initialized = 0;
    pthread_mutex_init(&lock, NULL); /* the parent's threads that held it are gone */
}

__attribute__((constructor)) static void models_fork(void) { pthread_atfork(NULL, NULL, child_after_fork); }

static CUresult s_cuInit(unsigned flags) {
    (void)flags;
    if (forked_after_init) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    configure();
    initialized = 1;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static CUresult s_cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13020; /* CUDA 13.2, as NVIDIA's runtime 13.2 wants */
    return CUDA_SUCCESS;
}

static CUresult s_cuDeviceGetCount(int *n) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = ndevices;
    return CUDA_SUCCESS;
}

static CUresult s_cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

/* Every process sees the same UUID for a device, as NVIDIA's driver gives each GPU one. */
static CUresult s_cuDeviceGetUuid(char uuid[16], CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    memcpy(uuid, "fakecuda-gpu-\0\0\0", 16);
    uuid[15] = (char)d;
    return CUDA_SUCCESS;
}

static CUresult s_cuDeviceGetName(char *name, int len, CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "fakecuda simulated device %d", d);
    return CUDA_SUCCESS;
}

static CUresult s_cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = capacity;
    return CUDA_SUCCESS;
}

static const char *error_name(CUresult e) {
    switch (e) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case 209: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case 400: return "CUDA_ERROR_INVALID_HANDLE";
    case 600: return "CUDA_ERROR_NOT_READY";
    default: return NULL;
    }
}

static CUresult s_cuGetErrorName(CUresult e, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = error_name(e);
    return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult s_cuGetErrorString(CUresult e, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
    case CUDA_SUCCESS: *s = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "initialization error"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: *s = "context is destroyed"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *s = "operation not supported"; break;
    case 209: *s = "no kernel image is available for execution on the device"; break;
    case 400: *s = "invalid resource handle"; break;
    case 600: *s = "device not ready"; break;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ----- contexts ----- */

static CUresult s_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    ctxs[d].state = CTX_LIVE;
    ctxs[d].refs++;
    *pctx = &ctxs[d];
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static CUresult s_cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    CUresult e = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (ctxs[d].refs <= 0) e = CUDA_ERROR_INVALID_CONTEXT;
    else if (--ctxs[d].refs == 0) { /* the last release destroys it: the handle stays */
        kill_allocations(&ctxs[d]);
        ctxs[d].state = CTX_INACTIVE;
    }
    pthread_mutex_unlock(&lock);
    cls_run_destructors();
    return e;
}

static CUresult s_cuDevicePrimaryCtxReset_v2(CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    kill_allocations(&ctxs[d]);
    ctxs[d].state = CTX_INACTIVE;
    if (!reset_keeps_refs) ctxs[d].refs = 0;
    pthread_mutex_unlock(&lock);
    cls_run_destructors();
    return CUDA_SUCCESS;
}

static CUresult s_cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *flags = 0;
    *active = ctxs[d].state == CTX_LIVE;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxCreate_v2(CUcontext *pctx, unsigned flags, CUdevice d) {
    (void)flags;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (depth == STACK_DEPTH) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    CUcontext c = reuse_contexts && last_destroyed && last_destroyed->state == CTX_DESTROYED ? last_destroyed : NULL;
    for (int pass = 0; pass < 2 && !c; pass++) /* never-used slots first, so stale handles stay destroyed */
        for (int i = MAX_DEV; i < MAX_CTX && !c; i++)
            if (ctxs[i].state == (pass ? CTX_DESTROYED : CTX_FREE)) c = &ctxs[i];
    if (c) *c = (struct fake_ctx){CTX_LIVE, d, 0, 1};
    pthread_mutex_unlock(&lock);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    stack[depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxDestroy_v2(CUcontext c) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    CUresult e = !c || !known_ctx(c) || c->primary ? CUDA_ERROR_INVALID_CONTEXT
                 : c->state == CTX_DESTROYED      ? CUDA_ERROR_CONTEXT_IS_DESTROYED
                                                  : CUDA_SUCCESS;
    if (!e) {
        kill_allocations(c);
        c->state = CTX_DESTROYED;
        last_destroyed = c;
    }
    pthread_mutex_unlock(&lock);
    cls_run_destructors();
    if (!e && depth && stack[depth - 1] == c) depth--; /* current on this thread: popped */
    return e;
}

static CUresult s_cuCtxGetCurrent(CUcontext *pctx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = current();
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxSetCurrent(CUcontext c) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!c) {
        if (depth) depth--;
        return CUDA_SUCCESS;
    }
    if (!known_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (c->state == CTX_DESTROYED) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (depth) stack[depth - 1] = c;
    else stack[depth++] = c;
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxPushCurrent_v2(CUcontext c) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!c || !known_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (c->state == CTX_DESTROYED) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (depth == STACK_DEPTH) return CUDA_ERROR_OUT_OF_MEMORY;
    stack[depth++] = c;
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxPopCurrent_v2(CUcontext *pctx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!depth) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = stack[--depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxGetDevice(CUdevice *d) {
    CUresult e = need_ctx();
    if (e) return e;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = current()->dev;
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxSynchronize(void) {
    CUresult e = need_ctx();
    if (!e) e = capture_forbids_sync();
    if (e) return e;
    pthread_mutex_lock(&lock);
    synchronize();
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* ----- streams: handles only; one global queue ----- */

static CUresult s_cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    CUresult e = need_ctx();
    if (e) return e;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (reuse_streams && last_destroyed_stream) {
        *s = last_destroyed_stream;
        last_destroyed_stream = NULL;
    } else {
        *s = (CUstream)(uintptr_t)(0xfa4e0000UL + 0x10 * next_stream++);
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* Work queued on the stream stays queued (one queue for every stream here), as NVIDIA's driver
 * lets it finish after the destroy returns. */
static CUresult s_cuStreamDestroy_v2(CUstream s) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    last_destroyed_stream = s;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static CUresult s_cuStreamSynchronize(CUstream s) {
    CUresult e = s ? (initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED) : need_ctx(); /* the NULL stream is the context's */
    if (e) return e;
    pthread_mutex_lock(&lock);
    synchronize();
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* ----- device, managed, pinned memory ----- */

static CUresult s_cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    CUresult e = capture_forbids();
    return e ? e : alloc_mem(p, size, K_DEVICE);
}

static CUresult s_cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned elem) {
    if (!pitch || !width || !height || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t row = (width + 511) & ~(size_t)511;
    if (height > SIZE_MAX / row) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult e = alloc_mem(p, row * height, K_DEVICE);
    if (!e) *pitch = row;
    return e;
}

static CUresult s_cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags) {
    (void)flags;
    return alloc_mem(p, size, K_MANAGED);
}

static CUresult s_cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) {
    (void)s; /* allocated at once: the allocation is ready before any later work on any stream */
    return alloc_mem(p, size, K_ASYNC);
}

static CUresult s_cuMemHostAlloc(void **pp, size_t size, unsigned flags) {
    (void)flags;
    CUdeviceptr p = 0;
    CUresult e = alloc_mem(pp ? &p : NULL, size, K_HOST);
    if (!e) *pp = (void *)(uintptr_t)p;
    return e;
}

static CUresult s_cuMemAllocHost_v2(void **pp, size_t size) { return s_cuMemHostAlloc(pp, size, 0); }

/* cuMemFree synchronizes first (work queued on the block finishes), then frees; 0 is no
 * allocation and succeeds (cudaFree(NULL) of NVIDIA's runtime 13 passes it on). As NVIDIA's
 * driver, it finds the allocation by its address (unified addressing) and frees it in its owning
 * context whatever is current, or none (cuda-python's tests free so; UCX relies on it). */
static CUresult s_cuMemFree_v2(CUdeviceptr p) {
    CUresult e = CUDA_SUCCESS;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!p) return CUDA_SUCCESS; /* as free(NULL): NVIDIA's runtime frees 0 to initialize a context */
    if ((e = capture_forbids_sync())) return e;
    pthread_mutex_lock(&lock);
    synchronize();
    int i = find_base((uintptr_t)p, M(K_DEVICE) | M(K_ASYNC) | M(K_MANAGED));
    if (i < 0) e = CUDA_ERROR_INVALID_VALUE;
    else {
        if (allocs[i].kind == K_DEVICE) counters.frees++;
        release_slot(i);
    }
    pthread_mutex_unlock(&lock);
    return e;
}

/* Host memory is no context's: freed from any thread, with any context current or none. */
static CUresult s_cuMemFreeHost(void *p) {
    CUresult e = CUDA_SUCCESS;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    synchronize();
    int i = find_base((uintptr_t)p, M(K_HOST));
    if (i < 0) e = CUDA_ERROR_INVALID_VALUE;
    else {
        counters.host_frees++;
        release_slot(i);
    }
    pthread_mutex_unlock(&lock);
    return e;
}

/* The free is queued: it happens at the next synchronization, after the work queued before it. */
static CUresult s_cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    (void)s;
    CUresult e = need_ctx();
    if (e) return e;
    pthread_mutex_lock(&lock);
    int i = find_base((uintptr_t)p, M(K_DEVICE) | M(K_ASYNC) | M(K_MANAGED));
    if (i < 0 || allocs[i].freeing) e = CUDA_ERROR_INVALID_VALUE; /* a double free, even before it ran */
    else {
        allocs[i].freeing = 1;
        enqueue((struct op){1, i, allocs[i].serial, NULL, 0, 0});
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    CUresult e = need_ctx();
    if (e) return e;
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *total = capacity;
    *free_bytes = capacity - device_used(current()->dev);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* ----- queries ----- */

static CUresult s_cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    int i = find_containing((uintptr_t)p, MEMORY);
    if (i >= 0) {
        if (base) *base = allocs[i].base;
        if (size) *size = allocs[i].size;
    }
    pthread_mutex_unlock(&lock);
    return i < 0 ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
}

/* Writes one attribute of allocation i (or of an unknown pointer when i < 0, as zeros). */
static CUresult attribute(void *data, int attr, int i, CUdeviceptr p) {
    struct alloc *a = i >= 0 ? &allocs[i] : NULL;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = a ? a->ctx : NULL; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = !a ? 0 : a->kind == K_HOST ? CU_MEMORYTYPE_HOST : a->kind == K_MANAGED ? CU_MEMORYTYPE_UNIFIED : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = a ? p : 0; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: /* only pinned and managed memory have a host address */
        *(void **)data = a && (a->kind == K_HOST || a->kind == K_MANAGED) ? (void *)(uintptr_t)p : NULL;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = a ? a->serial : 0; break; /* never reused */
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: /* documented as a bool; NVIDIA's runtime reads 4 bytes, so the driver writes 4 */
        *(unsigned *)data = a && a->kind == K_MANAGED;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = a ? a->dev : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = a ? a->base : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = a ? a->size : 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned char *)data = a != NULL; break; /* a bool */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult s_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int i = find_containing((uintptr_t)p, MEMORY);
    CUresult e = i < 0 ? CUDA_ERROR_INVALID_VALUE : attribute(data, attr, i, p);
    if (!e && attr == CU_POINTER_ATTRIBUTE_HOST_POINTER && !*(void **)data) e = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
    CUresult e = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    int i = find_containing((uintptr_t)p, MEMORY);
    for (unsigned k = 0; k < n && !e; k++)
        if (data[k]) e = attribute(data[k], attrs[k], i, p);
    pthread_mutex_unlock(&lock);
    return e;
}

/* ----- IPC: the handle names the whole allocation's memfd, opened through /proc ----- */

static CUresult s_cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    CUresult e = need_ctx();
    if (e) return e;
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int i = find_containing((uintptr_t)p, MEMORY);
    struct stat st;
    if (i < 0 || allocs[i].kind != K_DEVICE || fstat(allocs[i].fd, &st) != 0) e = CUDA_ERROR_INVALID_VALUE;
    else {
        struct ipc_handle ih = {IPC_MAGIC, (int32_t)getpid(), allocs[i].fd, allocs[i].size, (uint64_t)st.st_ino, (uint64_t)st.st_dev};
        memset(h, 0, sizeof *h);
        memcpy(h->reserved, &ih, sizeof ih);
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuIpcOpenMemHandle_v2(CUdeviceptr *out, CUipcMemHandle h, unsigned flags) {
    (void)flags;
    CUresult e = need_ctx();
    if (e) return e;
    struct ipc_handle ih;
    memcpy(&ih, h.reserved, sizeof ih);
    if (!out || ih.magic != IPC_MAGIC || ih.pid == getpid() || !ih.size) return CUDA_ERROR_INVALID_VALUE;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", ih.pid, ih.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != ih.ino || (uint64_t)st.st_dev != ih.dev || (uint64_t)st.st_size != ih.size) {
        close(fd); /* the exporter freed it and the fd number names another file now */
        return CUDA_ERROR_INVALID_VALUE;
    }
    void *p = mmap(NULL, ih.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    int slot = free_slot();
    CUcontext c = current();
    if (slot < 0 || (e = usable(c))) {
        munmap(p, ih.size);
        if (!e) e = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        allocs[slot] = (struct alloc){K_IPC, -1, c->dev, 0, c, (uintptr_t)p, ih.size, next_serial++};
        *out = (CUdeviceptr)(uintptr_t)p;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuIpcCloseMemHandle(CUdeviceptr p) {
    CUresult e = need_ctx();
    if (e) return e;
    pthread_mutex_lock(&lock);
    int i = find_base((uintptr_t)p, M(K_IPC));
    if (i < 0) e = CUDA_ERROR_INVALID_VALUE;
    else release_slot(i);
    pthread_mutex_unlock(&lock);
    return e;
}

/* ----- VMM: PROT_NONE reservations, memfd-backed handles mapped MAP_FIXED -----
 * As NVIDIA's driver API documents them: a reservation is address space with no access; a
 * physical handle (cuMemCreate) is memory counted against the device's capacity, here a memfd;
 * cuMemMap maps it at a reserved address, with no access until cuMemSetAccess (read-write);
 * cuMemUnmap makes the range a reservation again. Sizes, offsets and addresses are multiples of
 * the granularity (2 MiB); a range is mapped at most once; cuMemUnmap takes whole mappings
 * only; a handle released while mapped keeps its memory until its last mapping goes.
 * FAKECUDA_NO_VMM=1 is a driver without the API: the attribute says 0 and every call answers
 * CUDA_ERROR_NOT_SUPPORTED. FAKECUDA_NO_POSIX_FD=1 is a device without POSIX file descriptor
 * handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED says 0, cuMemCreate
 * asking for one and every export answer CUDA_ERROR_NOT_SUPPORTED). FAKECUDA_RESERVE_REFUSED=1 refuses every cuMemAddressReserve with
 * CUDA_ERROR_OUT_OF_MEMORY, as an address-space limit would. */

typedef struct { int type; int requestedHandleTypes; struct { int type; int id; } location; void *win32HandleMetaData; unsigned char allocFlags[8]; } CUmemAllocationProp;
typedef struct { struct { int type; int id; } location; int flags; } CUmemAccessDesc;
#define VMM_GRANULARITY (2UL << 20)
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102

static int no_vmm(void) {
    const char *v = getenv("FAKECUDA_NO_VMM");
    return v && *v == '1';
}

static int no_posix_fd(void) {
    const char *v = getenv("FAKECUDA_NO_POSIX_FD");
    return v && *v == '1';
}

static CUresult vmm_entry(void) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return no_vmm() ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
}

static int aligned(uint64_t v) { return v % VMM_GRANULARITY == 0; }

static int device_prop(const CUmemAllocationProp *prop) {
    return prop && prop->type == 1 /* PINNED */ && prop->location.type == 1 /* DEVICE */ && prop->location.id >= 0 && prop->location.id < ndevices;
}

static int device_attribute(int attr, int d); /* fakecuda_runtime.c */

static CUresult s_cuDeviceGetAttribute(int *value, int attr, CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *value = device_attribute(attr, d);
    return CUDA_SUCCESS;
}

/* cuCtxEnablePeerAccess: peer_enabled[a][b]: kernels of device a's contexts may touch device b's
 * memory (cuMemAlloc'd memory of b's contexts; memory of the virtual memory API needs its own
 * cuMemSetAccess for a, as NVIDIA documents). */
static int peer_enabled[MAX_DEV][MAX_DEV];

static CUresult s_cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= ndevices || peer < 0 || peer >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *can = d != peer;
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
    CUresult e = need_ctx();
    if (e) return e;
    if (!peer || flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUcontext c = current();
    if (peer->dev == c->dev) e = CUDA_ERROR_INVALID_DEVICE;
    else if (peer_enabled[c->dev][peer->dev]) e = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    else peer_enabled[c->dev][peer->dev] = 1;
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    (void)option;
    CUresult e = vmm_entry();
    if (e) return e;
    if (!g || !device_prop(prop)) return CUDA_ERROR_INVALID_VALUE;
    *g = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

static CUresult s_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
    CUresult e = vmm_entry();
    if (e) return e;
    if (!h || !size || !aligned(size) || !device_prop(prop) || flags) return CUDA_ERROR_INVALID_VALUE;
    int shareable = prop->requestedHandleTypes & 1; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
    if (shareable && no_posix_fd()) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = prop->location.id;
    pthread_mutex_lock(&lock);
    int slot = free_slot();
    int fd = -1;
    if (slot < 0 || take_memory(dev, size)) e = CUDA_ERROR_OUT_OF_MEMORY;
    else if ((fd = new_memfd(size)) < 0) {
        give_memory(dev, size);
        e = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        allocs[slot] = (struct alloc){K_VMM_HANDLE, fd, dev, 1, NULL, 0, size, next_serial++};
        allocs[slot].shareable = shareable;
        *h = (CUmemGenericAllocationHandle)slot + 1;
        vmm_calls++;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

/* The live handle h names, or NULL. */
static struct alloc *vmm_handle(CUmemGenericAllocationHandle h) {
    if (h < 1 || h > MAX_ALLOC) return NULL;
    struct alloc *a = &allocs[h - 1];
    return a->kind == K_VMM_HANDLE && !a->released ? a : NULL;
}

static CUresult s_cuMemRelease(CUmemGenericAllocationHandle h) {
    CUresult e = vmm_entry();
    if (e) return e;
    pthread_mutex_lock(&lock);
    struct alloc *a = vmm_handle(h);
    if (!a) e = CUDA_ERROR_INVALID_VALUE;
    else if (a->maps) a->released = 1; /* its mappings keep the memory until they are unmapped */
    else release_slot((int)h - 1);
    if (!e) vmm_calls++;
    pthread_mutex_unlock(&lock);
    return e;
}

/* Mapping k goes: its range is a reservation again, and a released handle with no mapping left
 * gives its memory back. */
static void drop_mapping(int k) {
    struct alloc *m = &allocs[k];
    /* Unmapping does not wait for the device: a queued kernel on this memory would fault, as on
     * a GPU (a sticky illegal address that ends the context). A pool that unmaps too early dies
     * here, loudly. */
    for (int q = 0; q < nqueued; q++)
        if (!queue[q].is_free && queue[q].slot == k && queue[q].serial == m->serial) {
            fprintf(stderr, "fakecuda: illegal address: %#lx unmapped while a queued kernel uses it\n", (unsigned long)m->base);
            abort();
        }
    mmap((void *)m->base, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    int h = m->handle - 1;
    release_slot(k);
    if (h >= 0 && allocs[h].kind == K_VMM_HANDLE && --allocs[h].maps == 0 && allocs[h].released) release_slot(h);
}

static CUresult s_cuMemAddressReserve(CUdeviceptr *out, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    CUresult e = vmm_entry();
    if (e) return e;
    if (!out || !size || !aligned(size) || flags) return CUDA_ERROR_INVALID_VALUE;
    const char *refused = getenv("FAKECUDA_RESERVE_REFUSED");
    if (refused && *refused == '1') return CUDA_ERROR_OUT_OF_MEMORY;
    if (align < VMM_GRANULARITY) align = VMM_GRANULARITY;
    if (align & (align - 1)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int slot = free_slot();
    void *raw = slot < 0 || size + align < size ? MAP_FAILED : mmap((void *)(uintptr_t)addr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) e = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        uintptr_t lo = (uintptr_t)raw, start = (lo + align - 1) & ~(align - 1);
        if (start > lo) munmap(raw, start - lo);
        if (lo + size + align > start + size) munmap((void *)(start + size), lo + size + align - start - size);
        allocs[slot] = (struct alloc){K_VMM_RESERVE, -1, 0, 0, NULL, start, size, next_serial++};
        *out = start;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuMemAddressFree(CUdeviceptr p, size_t size) {
    CUresult e = vmm_entry();
    if (e) return e;
    pthread_mutex_lock(&lock);
    int i = find_base((uintptr_t)p, M(K_VMM_RESERVE));
    if (i < 0 || allocs[i].size != size) e = CUDA_ERROR_INVALID_VALUE;
    else {
        for (int k = 0; k < MAX_ALLOC; k++) /* mappings left inside go with the range */
            if (allocs[k].kind == K_VMM_MAP && allocs[k].base >= p && allocs[k].base - p < size) drop_mapping(k);
        release_slot(i);
    }
    pthread_mutex_unlock(&lock);
    return e;
}

/* Whether some mapping overlaps [p, p + size). */
static int mapped_overlap(uintptr_t p, size_t size) {
    for (int k = 0; k < MAX_ALLOC; k++)
        if (allocs[k].kind == K_VMM_MAP && allocs[k].base < p + size && p < allocs[k].base + allocs[k].size) return 1;
    return 0;
}

/* Whether [p, p + size) is tiled by whole mappings; each is passed to f when f is not NULL. */
static int whole_mappings(uintptr_t p, size_t size, void (*f)(int)) {
    for (uintptr_t at = p; at < p + size;) {
        int k = find_base(at, M(K_VMM_MAP));
        if (k < 0 || allocs[k].size > p + size - at) return 0;
        at += allocs[k].size;
    }
    if (f)
        for (uintptr_t at = p; at < p + size;) {
            int k = find_base(at, M(K_VMM_MAP));
            at += allocs[k].size;
            f(k);
        }
    return 1;
}

static CUresult s_cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
    CUresult e = vmm_entry();
    if (e) return e;
    pthread_mutex_lock(&lock);
    int r = find_containing((uintptr_t)p, M(K_VMM_RESERVE));
    int slot = free_slot();
    struct alloc *a = vmm_handle(h);
    if (r < 0 || !a || flags || !size || !aligned(p) || !aligned(size) || !aligned(offset) || offset > a->size || size > a->size - offset ||
        size > allocs[r].size - (p - allocs[r].base) || mapped_overlap((uintptr_t)p, size))
        e = CUDA_ERROR_INVALID_VALUE;
    else if (slot < 0 || mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)offset) == MAP_FAILED)
        e = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        allocs[slot] = (struct alloc){K_VMM_MAP, -1, a->dev, 0, NULL, (uintptr_t)p, size, next_serial++};
        allocs[slot].handle = (int)h;
        a->maps++;
        vmm_calls++;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count) {
    CUresult e = vmm_entry();
    if (e) return e;
    if (!desc || !count || !size || !aligned(p) || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (desc[i].location.type != 1 || desc[i].location.id < 0 || desc[i].location.id >= ndevices || (desc[i].flags != 0 && desc[i].flags != 1 && desc[i].flags != 3))
            return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    /* Host pages stand for the device's: accessible while any device may read them. */
    if (!whole_mappings((uintptr_t)p, size, NULL)) e = CUDA_ERROR_INVALID_VALUE;
    else
        for (uintptr_t at = (uintptr_t)p; at < (uintptr_t)p + size;) {
            int k = find_base(at, M(K_VMM_MAP));
            for (size_t i = 0; i < count; i++) {
                int bit = 1 << desc[i].location.id;
                allocs[k].access = desc[i].flags == 3 ? allocs[k].access | bit : allocs[k].access & ~bit;
            }
            mprotect((void *)allocs[k].base, allocs[k].size, allocs[k].access ? PROT_READ | PROT_WRITE : PROT_NONE);
            at += allocs[k].size;
        }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuMemUnmap(CUdeviceptr p, size_t size) {
    CUresult e = vmm_entry();
    if (e) return e;
    pthread_mutex_lock(&lock);
    if (!size || !aligned(p) || !aligned(size) || !whole_mappings((uintptr_t)p, size, drop_mapping)) e = CUDA_ERROR_INVALID_VALUE;
    else vmm_calls++;
    pthread_mutex_unlock(&lock);
    return e;
}

/* ---------- cuGetProcAddress: a static table, never dlsym ---------- */

struct proc { const char *name; void *fn; };
static CUresult s_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
static CUresult s_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult *status);

#define P(base, impl) {base, (void *)impl}

#include "fakecuda_runtime.c" /* what NVIDIA's runtime needs: more entry points, stubs */
#include "fakecuda_private.c" /* its private tables, behind cuGetExportTable */

/* NVIDIA's runtime asks for private tables after its lookups. */
static CUresult s_cuGetExportTable(const void **table, const void *id) { return private_table(table, id); }

static const struct proc procs[] = {
    P("cuInit", s_cuInit),
    P("cuDriverGetVersion", s_cuDriverGetVersion),
    P("cuDeviceGet", s_cuDeviceGet),
    P("cuDeviceGetCount", s_cuDeviceGetCount),
    P("cuDeviceGetName", s_cuDeviceGetName),
    P("cuDeviceGetUuid", s_cuDeviceGetUuid),
    P("cuDeviceCanAccessPeer", s_cuDeviceCanAccessPeer),
    P("cuCtxEnablePeerAccess", s_cuCtxEnablePeerAccess),
    P("cuDeviceTotalMem", s_cuDeviceTotalMem_v2),
    P("cuGetErrorString", s_cuGetErrorString),
    P("cuGetErrorName", s_cuGetErrorName),
    P("cuGetProcAddress", s_cuGetProcAddress_v2), /* the CUDA 12 version has the status argument */
    P("cuGetExportTable", s_cuGetExportTable),
    P("cuDevicePrimaryCtxRetain", s_cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", s_cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", s_cuDevicePrimaryCtxReset_v2),
    P("cuDevicePrimaryCtxGetState", s_cuDevicePrimaryCtxGetState),
    P("cuCtxCreate", s_cuCtxCreate_v2),
    P("cuCtxDestroy", s_cuCtxDestroy_v2),
    P("cuCtxGetCurrent", s_cuCtxGetCurrent),
    P("cuCtxSetCurrent", s_cuCtxSetCurrent),
    P("cuCtxPushCurrent", s_cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", s_cuCtxPopCurrent_v2),
    P("cuCtxGetDevice", s_cuCtxGetDevice),
    P("cuCtxSynchronize", s_cuCtxSynchronize),
    P("cuStreamCreate", s_cuStreamCreate),
    P("cuStreamDestroy", s_cuStreamDestroy_v2),
    P("cuStreamSynchronize", s_cuStreamSynchronize),
    P("cuMemAlloc", s_cuMemAlloc_v2),
    P("cuMemAllocPitch", s_cuMemAllocPitch_v2),
    P("cuMemAllocManaged", s_cuMemAllocManaged),
    P("cuMemAllocAsync", s_cuMemAllocAsync),
    P("cuMemFree", s_cuMemFree_v2),
    P("cuMemFreeAsync", s_cuMemFreeAsync),
    P("cuMemGetInfo", s_cuMemGetInfo_v2),
    P("cuMemHostAlloc", s_cuMemHostAlloc),
    P("cuMemAllocHost", s_cuMemAllocHost_v2),
    P("cuMemFreeHost", s_cuMemFreeHost),
    P("cuMemGetAddressRange", s_cuMemGetAddressRange_v2),
    P("cuPointerGetAttribute", s_cuPointerGetAttribute),
    P("cuPointerGetAttributes", s_cuPointerGetAttributes),
    P("cuIpcGetMemHandle", s_cuIpcGetMemHandle),
    P("cuIpcOpenMemHandle", s_cuIpcOpenMemHandle_v2),
    P("cuIpcCloseMemHandle", s_cuIpcCloseMemHandle),
    P("cuMemGetAllocationGranularity", s_cuMemGetAllocationGranularity),
    P("cuMemCreate", s_cuMemCreate),
    P("cuMemRelease", s_cuMemRelease),
    P("cuMemAddressReserve", s_cuMemAddressReserve),
    P("cuMemAddressFree", s_cuMemAddressFree),
    P("cuMemMap", s_cuMemMap),
    P("cuMemSetAccess", s_cuMemSetAccess),
    P("cuMemUnmap", s_cuMemUnmap),
};

/* Every lookup, in order, for tests (fakecuda_proc_log): a program's runtime asks for hundreds. */
#define MAX_LOOKUPS 2048
static struct lookup { char name[64]; int version; cuuint64_t flags; } lookups[MAX_LOOKUPS];
static int nlookups;

static CUresult s_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
    if (symbol) {
        pthread_mutex_lock(&lock);
        if (nlookups < MAX_LOOKUPS) {
            struct lookup *l = &lookups[nlookups++];
            snprintf(l->name, sizeof l->name, "%s", symbol);
            l->version = version, l->flags = flags;
        }
        pthread_mutex_unlock(&lock);
    }
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, symbol) == 0) {
            *pfn = procs[i].fn;
            if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    if ((*pfn = runtime_proc(symbol))) { /* fakecuda_runtime.c's, or a stub */
        if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

static CUresult s_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return s_cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

/* ---------- exported names: both spellings where NVIDIA's libcuda has both ---------- */

#define EXPORT(name, impl, params, args) CUresult name params { return impl args; }
EXPORT(cuInit, s_cuInit, (unsigned f), (f))
EXPORT(cuDriverGetVersion, s_cuDriverGetVersion, (int *v), (v))
EXPORT(cuGetExportTable, s_cuGetExportTable, (const void **t, const void *id), (t, id))
EXPORT(cuDeviceGet, s_cuDeviceGet, (CUdevice *d, int o), (d, o))
EXPORT(cuDeviceGetCount, s_cuDeviceGetCount, (int *n), (n))
EXPORT(cuDeviceGetName, s_cuDeviceGetName, (char *s, int n, CUdevice d), (s, n, d))
EXPORT(cuDeviceGetUuid, s_cuDeviceGetUuid, (char *u, CUdevice d), (u, d))
EXPORT(cuDeviceGetUuid_v2, s_cuDeviceGetUuid, (char *u, CUdevice d), (u, d))
EXPORT(cuDeviceTotalMem, s_cuDeviceTotalMem_v2, (size_t *b, CUdevice d), (b, d))
EXPORT(cuDeviceTotalMem_v2, s_cuDeviceTotalMem_v2, (size_t *b, CUdevice d), (b, d))
EXPORT(cuGetErrorString, s_cuGetErrorString, (CUresult e, const char **s), (e, s))
EXPORT(cuGetErrorName, s_cuGetErrorName, (CUresult e, const char **s), (e, s))
EXPORT(cuGetProcAddress, s_cuGetProcAddress, (const char *s, void **p, int v, cuuint64_t f), (s, p, v, f))
EXPORT(cuGetProcAddress_v2, s_cuGetProcAddress_v2, (const char *s, void **p, int v, cuuint64_t f, CUdriverProcAddressQueryResult *st), (s, p, v, f, st))
EXPORT(cuDevicePrimaryCtxRetain, s_cuDevicePrimaryCtxRetain, (CUcontext *c, CUdevice d), (c, d))
EXPORT(cuDevicePrimaryCtxRelease, s_cuDevicePrimaryCtxRelease_v2, (CUdevice d), (d))
EXPORT(cuDevicePrimaryCtxRelease_v2, s_cuDevicePrimaryCtxRelease_v2, (CUdevice d), (d))
EXPORT(cuDevicePrimaryCtxReset, s_cuDevicePrimaryCtxReset_v2, (CUdevice d), (d))
EXPORT(cuDevicePrimaryCtxReset_v2, s_cuDevicePrimaryCtxReset_v2, (CUdevice d), (d))
EXPORT(cuDevicePrimaryCtxGetState, s_cuDevicePrimaryCtxGetState, (CUdevice d, unsigned *f, int *a), (d, f, a))
EXPORT(cuCtxCreate, s_cuCtxCreate_v2, (CUcontext *c, unsigned f, CUdevice d), (c, f, d))
EXPORT(cuCtxCreate_v2, s_cuCtxCreate_v2, (CUcontext *c, unsigned f, CUdevice d), (c, f, d))
EXPORT(cuCtxDestroy, s_cuCtxDestroy_v2, (CUcontext c), (c))
EXPORT(cuCtxDestroy_v2, s_cuCtxDestroy_v2, (CUcontext c), (c))
EXPORT(cuCtxGetCurrent, s_cuCtxGetCurrent, (CUcontext *c), (c))
EXPORT(cuCtxSetCurrent, s_cuCtxSetCurrent, (CUcontext c), (c))
EXPORT(cuCtxPushCurrent, s_cuCtxPushCurrent_v2, (CUcontext c), (c))
EXPORT(cuCtxPushCurrent_v2, s_cuCtxPushCurrent_v2, (CUcontext c), (c))
EXPORT(cuCtxPopCurrent, s_cuCtxPopCurrent_v2, (CUcontext *c), (c))
EXPORT(cuCtxPopCurrent_v2, s_cuCtxPopCurrent_v2, (CUcontext *c), (c))
EXPORT(cuCtxGetDevice, s_cuCtxGetDevice, (CUdevice *d), (d))
EXPORT(cuCtxSynchronize, s_cuCtxSynchronize, (void), ())
EXPORT(cuStreamBeginCapture, s_cuStreamBeginCapture, (CUstream s), (s))
EXPORT(cuStreamBeginCapture_ptsz, s_cuStreamBeginCapture, (CUstream s), (s))
EXPORT(cuStreamBeginCapture_v2, s_cuStreamBeginCapture_v2, (CUstream s, int m), (s, m))
EXPORT(cuStreamBeginCapture_v2_ptsz, s_cuStreamBeginCapture_v2, (CUstream s, int m), (s, m))
EXPORT(cuStreamEndCapture, s_cuStreamEndCapture, (CUstream s, void **g), (s, g))
EXPORT(cuStreamEndCapture_ptsz, s_cuStreamEndCapture, (CUstream s, void **g), (s, g))
EXPORT(cuThreadExchangeStreamCaptureMode, s_cuThreadExchangeStreamCaptureMode, (int *m), (m))
EXPORT(cuStreamCreate, s_cuStreamCreate, (CUstream *s, unsigned f), (s, f))
EXPORT(cuStreamDestroy, s_cuStreamDestroy_v2, (CUstream s), (s))
EXPORT(cuStreamDestroy_v2, s_cuStreamDestroy_v2, (CUstream s), (s))
EXPORT(cuStreamSynchronize, s_cuStreamSynchronize, (CUstream s), (s))
EXPORT(cuMemAlloc, s_cuMemAlloc_v2, (CUdeviceptr *p, size_t n), (p, n))
EXPORT(cuMemAlloc_v2, s_cuMemAlloc_v2, (CUdeviceptr *p, size_t n), (p, n))
EXPORT(cuMemAllocPitch, s_cuMemAllocPitch_v2, (CUdeviceptr *p, size_t *pi, size_t w, size_t h, unsigned e), (p, pi, w, h, e))
EXPORT(cuMemAllocPitch_v2, s_cuMemAllocPitch_v2, (CUdeviceptr *p, size_t *pi, size_t w, size_t h, unsigned e), (p, pi, w, h, e))
EXPORT(cuMemAllocManaged, s_cuMemAllocManaged, (CUdeviceptr *p, size_t n, unsigned f), (p, n, f))
EXPORT(cuMemAllocAsync, s_cuMemAllocAsync, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s))
EXPORT(cuMemFree, s_cuMemFree_v2, (CUdeviceptr p), (p))
EXPORT(cuMemFree_v2, s_cuMemFree_v2, (CUdeviceptr p), (p))
EXPORT(cuMemFreeAsync, s_cuMemFreeAsync, (CUdeviceptr p, CUstream s), (p, s))
/* One queue for every stream here: the per-thread default stream's spelling is the same call. */
EXPORT(cuMemFreeAsync_ptsz, s_cuMemFreeAsync, (CUdeviceptr p, CUstream s), (p, s))
EXPORT(cuMemGetInfo, s_cuMemGetInfo_v2, (size_t *f, size_t *t), (f, t))
EXPORT(cuMemGetInfo_v2, s_cuMemGetInfo_v2, (size_t *f, size_t *t), (f, t))
EXPORT(cuMemHostAlloc, s_cuMemHostAlloc, (void **p, size_t n, unsigned f), (p, n, f))
EXPORT(cuMemAllocHost, s_cuMemAllocHost_v2, (void **p, size_t n), (p, n))
EXPORT(cuMemAllocHost_v2, s_cuMemAllocHost_v2, (void **p, size_t n), (p, n))
EXPORT(cuMemFreeHost, s_cuMemFreeHost, (void *p), (p))
EXPORT(cuMemHostGetDevicePointer_v2, s_cuMemHostGetDevicePointer, (CUdeviceptr *d, void *p, unsigned f), (d, p, f))
EXPORT(cuMemHostGetFlags, s_cuMemHostGetFlags, (unsigned *f, void *p), (f, p))
EXPORT(cuMemGetAddressRange, s_cuMemGetAddressRange_v2, (CUdeviceptr *b, size_t *n, CUdeviceptr p), (b, n, p))
EXPORT(cuMemGetAddressRange_v2, s_cuMemGetAddressRange_v2, (CUdeviceptr *b, size_t *n, CUdeviceptr p), (b, n, p))
EXPORT(cuPointerGetAttribute, s_cuPointerGetAttribute, (void *d, int a, CUdeviceptr p), (d, a, p))
EXPORT(cuPointerGetAttributes, s_cuPointerGetAttributes, (unsigned n, int *a, void **d, CUdeviceptr p), (n, a, d, p))
EXPORT(cuIpcGetMemHandle, s_cuIpcGetMemHandle, (CUipcMemHandle *h, CUdeviceptr p), (h, p))
EXPORT(cuIpcOpenMemHandle, s_cuIpcOpenMemHandle_v2, (CUdeviceptr *p, CUipcMemHandle h, unsigned f), (p, h, f))
EXPORT(cuIpcOpenMemHandle_v2, s_cuIpcOpenMemHandle_v2, (CUdeviceptr *p, CUipcMemHandle h, unsigned f), (p, h, f))
EXPORT(cuIpcCloseMemHandle, s_cuIpcCloseMemHandle, (CUdeviceptr p), (p))
EXPORT(cuDeviceGetAttribute, s_cuDeviceGetAttribute, (int *v, int a, CUdevice d), (v, a, d))
EXPORT(cuDeviceCanAccessPeer, s_cuDeviceCanAccessPeer, (int *c, CUdevice d, CUdevice p), (c, d, p))
EXPORT(cuCtxEnablePeerAccess, s_cuCtxEnablePeerAccess, (CUcontext p, unsigned f), (p, f))
EXPORT(cuMemGetAllocationGranularity, s_cuMemGetAllocationGranularity, (size_t *g, const CUmemAllocationProp *p, int o), (g, p, o))
EXPORT(cuMemCreate, s_cuMemCreate, (CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *p, unsigned long long f), (h, n, p, f))
EXPORT(cuMemRelease, s_cuMemRelease, (CUmemGenericAllocationHandle h), (h))
EXPORT(cuMemAddressReserve, s_cuMemAddressReserve, (CUdeviceptr *p, size_t n, size_t a, CUdeviceptr addr, unsigned long long f), (p, n, a, addr, f))
EXPORT(cuMemAddressFree, s_cuMemAddressFree, (CUdeviceptr p, size_t n), (p, n))
EXPORT(cuMemMap, s_cuMemMap, (CUdeviceptr p, size_t n, size_t o, CUmemGenericAllocationHandle h, unsigned long long f), (p, n, o, h, f))
EXPORT(cuMemSetAccess, s_cuMemSetAccess, (CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t c), (p, n, d, c))
EXPORT(cuMemUnmap, s_cuMemUnmap, (CUdeviceptr p, size_t n), (p, n))
EXPORT(cuMemExportToShareableHandle, s_cuMemExportToShareableHandle, (void *o, CUmemGenericAllocationHandle h, int t, unsigned long long f), (o, h, t, f))
EXPORT(cuMemImportFromShareableHandle, s_cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *h, void *o, int t), (h, o, t))

/* ---------- test hooks ---------- */

void fakecuda_get_counters(struct fakecuda_counters *out) {
    pthread_mutex_lock(&lock);
    *out = counters;
    pthread_mutex_unlock(&lock);
}

/* How many cuMemCreate, cuMemMap, cuMemUnmap and cuMemRelease calls succeeded so far. */
uint64_t fakecuda_vmm_calls(void) {
    pthread_mutex_lock(&lock);
    uint64_t n = vmm_calls;
    pthread_mutex_unlock(&lock);
    return n;
}

/* A "kernel" writing [p, p+n) on a stream, run at the next synchronization. Fails at once with
 * CUDA_ERROR_ILLEGAL_ADDRESS when the range is not inside one live device or managed allocation
 * of the current context (a block of a reset or destroyed context, or of another context). */
int fakecuda_launch_memset(void *p, int value, size_t n) {
    CUresult e = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    CUcontext c = current();
    int i = find_containing((uintptr_t)p, M(K_DEVICE) | M(K_ASYNC) | M(K_MANAGED) | M(K_IPC) | M(K_VMM_MAP));
    if (!initialized || usable(c) || i < 0) e = CUDA_ERROR_ILLEGAL_ADDRESS;
    else if (allocs[i].kind == K_VMM_MAP) {
        /* Device memory of the virtual memory API: the range may span mappings side by side,
         * each accessible to this device (a kernel anywhere else faults). */
        uintptr_t at = (uintptr_t)p, end = (uintptr_t)p + n;
        for (int k = i; at < end; k = find_base(at, M(K_VMM_MAP))) {
            if (k < 0 || !(allocs[k].access >> c->dev & 1)) { e = CUDA_ERROR_ILLEGAL_ADDRESS; break; }
            at = allocs[k].base + allocs[k].size;
        }
        for (uintptr_t from = (uintptr_t)p; !e && from < end;) {
            int k = find_containing(from, M(K_VMM_MAP));
            size_t piece = allocs[k].base + allocs[k].size - from;
            if (piece > end - from) piece = end - from;
            enqueue((struct op){0, k, allocs[k].serial, (unsigned char *)from, piece, value});
            from += piece;
        }
    } else if (n > allocs[i].size - ((uintptr_t)p - allocs[i].base) ||
               (allocs[i].ctx ? allocs[i].ctx != c && !(allocs[i].dev != c->dev && peer_enabled[c->dev][allocs[i].dev]) : allocs[i].dev != c->dev))
        e = CUDA_ERROR_ILLEGAL_ADDRESS;
    else enqueue((struct op){0, i, allocs[i].serial, p, n, value});
    pthread_mutex_unlock(&lock);
    return e;
}

/* The driver's own answer to a lookup, and lookup number i (name, version, flags) as made; the
 * count of lookups made. */
int fakecuda_get_proc_address(const char *symbol, void **pfn, int version, unsigned long long flags) {
    return s_cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

int fakecuda_proc_log(int i, const char **name, int *version, unsigned long long *flags) {
    pthread_mutex_lock(&lock);
    int n = nlookups;
    if (i >= 0 && i < n) *name = lookups[i].name, *version = lookups[i].version, *flags = lookups[i].flags;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Reads one byte of live memory of any context (0), or answers 700 where a read would fault. */
int fakecuda_read_byte(const void *p, unsigned char *out) {
    pthread_mutex_lock(&lock);
    int i = find_containing((uintptr_t)p, MEMORY);
    if (i >= 0 && allocs[i].kind == K_VMM_MAP && !allocs[i].access) i = -1; /* mapped, no access */
    if (i >= 0) *out = *(const volatile unsigned char *)p;
    pthread_mutex_unlock(&lock);
    return i < 0 ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}
