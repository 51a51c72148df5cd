/* SIMULATOR: a stand-in CUDA runtime (libcudart.so.12) over the stand-in driver; not NVIDIA's runtime. */
/* Built the way NVIDIA's shared runtime is: it does not link libcuda; at first use it dlopens
 * libcuda.so.1 (RTLD_LOCAL), takes cuGetProcAddress_v2 with dlsym (cuGetProcAddress when
 * FAKECUDART_GET_PROC_SYMBOL names it) and every other driver entry point through that, so an
 * interposer sees none of them as symbol lookups. Its own entry points call one another through
 * static helpers, never through the PLT, except in the -DPLT_CALLS build: there
 * cudaHostAlloc(flags 0) calls cudaMallocHost and cudaMalloc calls cudaMemGetInfo through the
 * PLT, as a compatibility layer or profiling shim may. Per-thread current device and last error;
 * before work it uses the thread's current driver context when that is on the current device
 * (runtime/driver interop), else the device's primary context. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;
typedef void *CUstream;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef CUipcMemHandle cudaIpcMemHandle_t;
typedef CUstream cudaStream_t;

enum {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInitializationError = 3,
    cudaErrorInsufficientDriver = 35, cudaErrorInvalidDevice = 101, cudaErrorDeviceUninitialized = 201,
    cudaErrorSymbolNotFound = 500, cudaErrorIllegalAddress = 700, cudaErrorContextIsDestroyed = 709,
    cudaErrorUnknown = 999,
};
enum { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_UNIFIED = 4 };
enum {
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3, CU_POINTER_ATTRIBUTE_HOST_POINTER = 4, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
};
struct cudaPointerAttributes { int type; int device; void *devicePointer; void *hostPointer; };

#define MAX_DEV 4
#define DRIVER_VERSION_ASKED 12080

/* The driver's entry points, all from cuGetProcAddress. */
static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get_count)(int *);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*ctx_synchronize)(void);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_reset)(CUdevice);
    CUresult (*primary_state)(CUdevice, unsigned *, int *);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*mem_host_alloc)(void **, size_t, unsigned);
    CUresult (*mem_alloc_host)(void **, size_t);
    CUresult (*mem_free_host)(void *);
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*mem_free_async)(CUdeviceptr, CUstream);
    CUresult (*ipc_get)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*ipc_close)(CUdeviceptr);
    CUresult (*pointer_attributes)(unsigned, int *, void **, CUdeviceptr);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*ctx_enable_peer)(CUcontext, unsigned);
} drv;

static CUresult (*get_proc)(const char *, void **, int, unsigned long long, int *); /* cuGetProcAddress */
static CUresult (*get_proc_v1)(const char *, void **, int, unsigned long long);
static CUresult get_proc_through_v1(const char *symbol, void **fn, int version, unsigned long long flags, int *status) {
    CUresult e = get_proc_v1(symbol, fn, version, flags);
    if (status) *status = e == 0 ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS, _SYMBOL_NOT_FOUND */
    return e;
}
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int load_error; /* a runtime error code when the driver could not be loaded */
static int ndevices;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* A forked child: the driver answers every call with 3 there; this runtime's own lock may have
 * been held by a parent thread the child does not have. */
static void child_after_fork(void) { pthread_mutex_init(&lock, NULL); }

__attribute__((constructor)) static void models_fork(void) { pthread_atfork(NULL, NULL, child_after_fork); }
static CUcontext primary[MAX_DEV]; /* the primary contexts this runtime retained */
static __thread __attribute__((tls_model("initial-exec"))) int current_device; /* no malloc in __tls_get_addr */
static __thread __attribute__((tls_model("initial-exec"))) int last_error;

static void load(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    /* NVIDIA's CUDA 12 runtime takes cuGetProcAddress_v2 (it has the status argument); a test
     * may name the other spelling, to reach an interposer's other entry */
    const char *name = getenv("FAKECUDART_GET_PROC_SYMBOL");
    name = name && *name ? name : "cuGetProcAddress_v2";
    void *sym = lib ? dlsym(lib, name) : NULL;
    if (sym && strcmp(name, "cuGetProcAddress") == 0) {
        get_proc_v1 = (CUresult (*)(const char *, void **, int, unsigned long long))sym;
        get_proc = get_proc_through_v1;
    } else if (sym) {
        get_proc = (CUresult (*)(const char *, void **, int, unsigned long long, int *))sym;
    }
    if (!get_proc) {
        load_error = cudaErrorInsufficientDriver;
        return;
    }
    struct { const char *name; void **slot; } want[] = {
        {"cuInit", (void **)&drv.init},
        {"cuDeviceGetCount", (void **)&drv.device_get_count},
        {"cuCtxGetCurrent", (void **)&drv.ctx_get_current},
        {"cuCtxSetCurrent", (void **)&drv.ctx_set_current},
        {"cuCtxGetDevice", (void **)&drv.ctx_get_device},
        {"cuCtxSynchronize", (void **)&drv.ctx_synchronize},
        {"cuDevicePrimaryCtxRetain", (void **)&drv.primary_retain},
        {"cuDevicePrimaryCtxReset", (void **)&drv.primary_reset},
        {"cuDevicePrimaryCtxGetState", (void **)&drv.primary_state},
        {"cuMemAlloc", (void **)&drv.mem_alloc},
        {"cuMemFree", (void **)&drv.mem_free},
        {"cuMemGetInfo", (void **)&drv.mem_get_info},
        {"cuMemHostAlloc", (void **)&drv.mem_host_alloc},
        {"cuMemAllocHost", (void **)&drv.mem_alloc_host},
        {"cuMemFreeHost", (void **)&drv.mem_free_host},
        {"cuMemAllocManaged", (void **)&drv.mem_alloc_managed},
        {"cuMemAllocAsync", (void **)&drv.mem_alloc_async},
        {"cuMemFreeAsync", (void **)&drv.mem_free_async},
        {"cuIpcGetMemHandle", (void **)&drv.ipc_get},
        {"cuIpcOpenMemHandle", (void **)&drv.ipc_open},
        {"cuIpcCloseMemHandle", (void **)&drv.ipc_close},
        {"cuPointerGetAttributes", (void **)&drv.pointer_attributes},
        {"cuStreamCreate", (void **)&drv.stream_create},
        {"cuStreamDestroy", (void **)&drv.stream_destroy},
        {"cuStreamSynchronize", (void **)&drv.stream_synchronize},
        {"cuCtxEnablePeerAccess", (void **)&drv.ctx_enable_peer},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (get_proc(want[i].name, want[i].slot, DRIVER_VERSION_ASKED, 0, NULL) != 0 || !*want[i].slot) {
            load_error = cudaErrorInsufficientDriver;
            return;
        }
    }
    if (drv.init(0) != 0 || drv.device_get_count(&ndevices) != 0) load_error = cudaErrorInitializationError;
}

/* Driver codes to runtime codes: the same numbers for the ones modelled, except as listed. */
static int map(CUresult e) {
    switch (e) {
    case 0: return cudaSuccess;
    case 1: return cudaErrorInvalidValue;
    case 2: return cudaErrorMemoryAllocation;
    case 3: return cudaErrorInitializationError;
    case 101: return cudaErrorInvalidDevice;
    case 201: return cudaErrorDeviceUninitialized;
    case 500: return cudaErrorSymbolNotFound;
    case 700: return cudaErrorIllegalAddress;
    case 709: return cudaErrorContextIsDestroyed;
    default: return cudaErrorUnknown;
    }
}

static int fail(int e) {
    if (e) last_error = e;
    return e;
}

static int driver(CUresult e) { return fail(map(e)); }

/* Makes the current device's primary context current (retained again when it was reset or
 * never retained by this runtime); its handle stays the same across a reset. */
static int use_primary(void) {
    unsigned flags = 0;
    int active = 0;
    CUresult e = drv.primary_state(current_device, &flags, &active);
    if (e) return driver(e);
    pthread_mutex_lock(&lock);
    CUcontext c = primary[current_device];
    if (!c || !active) {
        e = drv.primary_retain(&c, current_device);
        if (!e) primary[current_device] = c;
    }
    pthread_mutex_unlock(&lock);
    if (e) return driver(e);
    return driver(drv.ctx_set_current(c));
}

/* Before work: the thread's current driver context when it is on the current device (runtime
 * and driver interop, as NVIDIA's runtime does), else the device's primary context. */
static int ensure_context(void) {
    pthread_once(&once, load);
    if (load_error) return fail(load_error);
    CUcontext cur = NULL;
    CUdevice d = -1;
    if (drv.ctx_get_current(&cur) == 0 && cur && drv.ctx_get_device(&d) == 0 && d == current_device) return cudaSuccess;
    return use_primary();
}

#define NEED_CONTEXT()                      \
    do {                                    \
        int e_ = ensure_context();          \
        if (e_) return e_;                  \
    } while (0)

/* ---------- devices, errors ---------- */

int cudaGetDeviceCount(int *n) {
    pthread_once(&once, load);
    if (load_error) return fail(load_error);
    if (!n) return fail(cudaErrorInvalidValue);
    *n = ndevices;
    return cudaSuccess;
}

int cudaGetDevice(int *d) {
    if (!d) return fail(cudaErrorInvalidValue);
    *d = current_device;
    return cudaSuccess;
}

int cudaSetDevice(int d) {
    pthread_once(&once, load);
    if (load_error) return fail(load_error);
    if (d < 0 || d >= ndevices || d >= MAX_DEV) return fail(cudaErrorInvalidDevice);
    current_device = d;
    return use_primary(); /* even when a user context on d is current */
}

int cudaGetLastError(void) {
    int e = last_error;
    last_error = 0;
    return e;
}

int cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorString(int e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorDeviceUninitialized: return "invalid device context";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorContextIsDestroyed: return "context is destroyed";
    default: return "unknown error";
    }
}

int cudaDeviceSynchronize(void) {
    NEED_CONTEXT();
    return driver(drv.ctx_synchronize());
}

/* Lets the current device's kernels use peer's memory: the driver's cuCtxEnablePeerAccess on
 * peer's primary context. */
int cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
    NEED_CONTEXT();
    if (peer < 0 || peer >= ndevices) return fail(cudaErrorInvalidDevice);
    CUcontext ctx = NULL;
    pthread_mutex_lock(&lock);
    if (!primary[peer] && drv.primary_retain(&primary[peer], peer) != 0) primary[peer] = NULL;
    ctx = primary[peer];
    pthread_mutex_unlock(&lock);
    if (!ctx) return fail(cudaErrorInvalidDevice);
    return driver(drv.ctx_enable_peer(ctx, flags));
}

/* Destroys the current device's primary context and every allocation in it. */
int cudaDeviceReset(void) {
    pthread_once(&once, load);
    if (load_error) return fail(load_error);
    pthread_mutex_lock(&lock);
    primary[current_device] = NULL;
    pthread_mutex_unlock(&lock);
    return driver(drv.primary_reset(current_device));
}

/* ---------- device memory ---------- */

static int mem_get_info(size_t *free_bytes, size_t *total) {
    NEED_CONTEXT();
    return driver(drv.mem_get_info(free_bytes, total));
}

int cudaMemGetInfo(size_t *free_bytes, size_t *total) { return mem_get_info(free_bytes, total); }

int cudaMalloc(void **p, size_t n) {
    if (!p) return fail(cudaErrorInvalidValue);
    NEED_CONTEXT();
#ifdef PLT_CALLS
    size_t f, t;
    (void)cudaMemGetInfo(&f, &t); /* through the PLT: an interposer's cudaMemGetInfo runs here */
#endif
    if (!n) {
        *p = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    int e = driver(drv.mem_alloc(&d, n));
    if (!e) *p = (void *)(uintptr_t)d;
    return e;
}

int cudaFree(void *p) {
    NEED_CONTEXT(); /* cudaFree(NULL) initializes the context and does nothing else, as NVIDIA's */
    if (!p) return cudaSuccess;
    return driver(drv.mem_free((CUdeviceptr)(uintptr_t)p));
}

int cudaMallocManaged(void **p, size_t n, unsigned flags) {
    if (!p || !n) return fail(cudaErrorInvalidValue);
    NEED_CONTEXT();
    CUdeviceptr d = 0;
    int e = driver(drv.mem_alloc_managed(&d, n, flags ? flags : 1 /* cudaMemAttachGlobal */));
    if (!e) *p = (void *)(uintptr_t)d;
    return e;
}

int cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
    if (!p) return fail(cudaErrorInvalidValue);
    NEED_CONTEXT();
    CUdeviceptr d = 0;
    int e = driver(drv.mem_alloc_async(&d, n, s));
    if (!e) *p = (void *)(uintptr_t)d;
    return e;
}

int cudaFreeAsync(void *p, cudaStream_t s) {
    NEED_CONTEXT();
    return driver(drv.mem_free_async((CUdeviceptr)(uintptr_t)p, s));
}

/* ---------- pinned host memory ---------- */

static int malloc_host(void **p, size_t n) {
    if (!p) return fail(cudaErrorInvalidValue);
    NEED_CONTEXT();
    return driver(drv.mem_alloc_host(p, n));
}

int cudaMallocHost(void **p, size_t n) { return malloc_host(p, n); }

int cudaHostAlloc(void **p, size_t n, unsigned flags) {
#ifdef PLT_CALLS
    if (flags == 0) return cudaMallocHost(p, n); /* through the PLT: an interposer's cudaMallocHost runs here */
#endif
    if (!flags) return malloc_host(p, n);
    if (!p) return fail(cudaErrorInvalidValue);
    NEED_CONTEXT();
    return driver(drv.mem_host_alloc(p, n, flags));
}

int cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    NEED_CONTEXT();
    return driver(drv.mem_free_host(p));
}

/* ---------- IPC, pointer attributes ---------- */

int cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) {
    NEED_CONTEXT();
    return driver(drv.ipc_get(h, (CUdeviceptr)(uintptr_t)p));
}

int cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags) {
    if (!p) return fail(cudaErrorInvalidValue);
    NEED_CONTEXT();
    CUdeviceptr d = 0;
    int e = driver(drv.ipc_open(&d, h, flags));
    if (!e) *p = (void *)(uintptr_t)d;
    return e;
}

int cudaIpcCloseMemHandle(void *p) {
    NEED_CONTEXT();
    return driver(drv.ipc_close((CUdeviceptr)(uintptr_t)p));
}

int cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    if (!a) return fail(cudaErrorInvalidValue);
    NEED_CONTEXT();
    unsigned type = 0;
    unsigned managed = 0; /* the driver writes 4 bytes, as NVIDIA's runtime reads them */
    int ordinal = 0;
    CUdeviceptr dptr = 0;
    void *hptr = NULL;
    int attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                   CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_HOST_POINTER};
    void *data[] = {&type, &managed, &ordinal, &dptr, &hptr};
    int e = driver(drv.pointer_attributes(5, attrs, data, (CUdeviceptr)(uintptr_t)p));
    if (e) return e;
    if (!type) { /* memory the driver does not know: ordinary host memory */
        *a = (struct cudaPointerAttributes){cudaMemoryTypeUnregistered, -2, NULL, (void *)p};
        return cudaSuccess;
    }
    a->type = managed ? cudaMemoryTypeManaged : type == CU_MEMORYTYPE_HOST ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    a->device = ordinal;
    a->devicePointer = (void *)(uintptr_t)dptr;
    a->hostPointer = hptr;
    return cudaSuccess;
}

/* ---------- streams ---------- */

int cudaStreamCreate(cudaStream_t *s) {
    NEED_CONTEXT();
    return driver(drv.stream_create(s, 0));
}

int cudaStreamSynchronize(cudaStream_t s) {
    NEED_CONTEXT();
    return driver(drv.stream_synchronize(s));
}

int cudaStreamDestroy(cudaStream_t s) {
    NEED_CONTEXT();
    return driver(drv.stream_destroy(s));
}

/* ---------- driver entry points for the program: through the driver's cuGetProcAddress ---------- */

int cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned version, unsigned long long flags, int *status) {
    pthread_once(&once, load);
    if (load_error) return fail(load_error);
    if (!symbol || !fn) return fail(cudaErrorInvalidValue);
    CUresult e = get_proc(symbol, fn, (int)version, flags, status);
    return e == 500 ? cudaSuccess : driver(e); /* not found: success with *fn NULL and the status saying so */
}

int cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags, int *status) {
    pthread_once(&once, load);
    if (load_error) return fail(load_error);
    if (!symbol || !fn) return fail(cudaErrorInvalidValue);
    CUresult e = get_proc(symbol, fn, DRIVER_VERSION_ASKED, flags, status);
    return e == 500 ? cudaSuccess : driver(e);
}
