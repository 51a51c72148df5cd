/* SIMULATOR: the part of the stand-in CUDA driver (c/fakecuda.c, not NVIDIA's driver) that NVIDIA's real runtime needs. */
/* Included by fakecuda.c (one translation unit: it shares the driver's static state), before
 * fakecuda_private.c (the runtime's private tables). What NVIDIA's libcudart (12.x and 13.x, as
 * PyTorch and CuPy ship it) asks of a driver beyond the memory calls the tests model:
 * - device attributes of a plausible GPU, events, stream queries, copies and memsets (after the
 *   queued work, each device side checked against live allocations), shareable handles of the
 *   virtual memory API, interprocess events, and module and library loads that answer "no
 *   kernel image" since no kernel runs;
 * - every other driver name the runtime asks cuGetProcAddress for gets a stub that answers
 *   CUDA_ERROR_NOT_SUPPORTED (FAKECUDA_TRACE=1 prints each stub called and each private-table
 *   slot the stand-in does not implement). */

#define FAKE_DRIVER_VERSION 13020

/* ---------- tracing ---------- */

static int tracing(void) {
    static int t = -1;
    if (t < 0) {
        const char *v = getenv("FAKECUDA_TRACE");
        t = v && *v == '1';
    }
    return t;
}

/* ---------- stubs for the names the stand-in does not model ---------- */

#define MAX_STUBS 1024
static char stub_names[MAX_STUBS][64];
static int nstubs;

/* Stub number `name` (five decimal digits: 1-4, then four base-4 digits) is stubs[i]. */
static CUresult stub_called(int name) {
    int i = 0;
    for (int scale = 1; name >= 10; name /= 10, scale *= 4) i += name % 10 * scale;
    i += (name - 1) * 256;
    if (tracing()) fprintf(stderr, "fakecuda: stub %s called\n", i < nstubs ? stub_names[i] : "?");
    return CUDA_ERROR_NOT_SUPPORTED;
}

#define STUB(i) static CUresult stub_##i(void) { return stub_called(i); }
#define STUB4(i) STUB(i##0) STUB(i##1) STUB(i##2) STUB(i##3)
#define STUB16(i) STUB4(i##0) STUB4(i##1) STUB4(i##2) STUB4(i##3)
#define STUB64(i) STUB16(i##0) STUB16(i##1) STUB16(i##2) STUB16(i##3)
#define STUB256(i) STUB64(i##0) STUB64(i##1) STUB64(i##2) STUB64(i##3)
STUB256(1) STUB256(2) STUB256(3) STUB256(4)
#define REF(i) (void *)stub_##i,
#define REF4(i) REF(i##0) REF(i##1) REF(i##2) REF(i##3)
#define REF16(i) REF4(i##0) REF4(i##1) REF4(i##2) REF4(i##3)
#define REF64(i) REF16(i##0) REF16(i##1) REF16(i##2) REF16(i##3)
#define REF256(i) REF64(i##0) REF64(i##1) REF64(i##2) REF64(i##3)
/* Base-4 digit names: stub_10000.. are the first 256, and so on; the order does not matter. */
static void *const stubs[MAX_STUBS] = {REF256(1) REF256(2) REF256(3) REF256(4)};

/* The stub answering `symbol` (the same one each time it is asked), or NULL for a name no
 * driver has: the empty probe, or anything not spelled like a driver entry point. */
static void *stub_for(const char *symbol) {
    if (strncmp(symbol, "cu", 2) != 0 || strlen(symbol) >= sizeof stub_names[0]) return NULL;
    void *fn = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nstubs && !fn; i++)
        if (strcmp(stub_names[i], symbol) == 0) fn = stubs[i];
    if (!fn && nstubs < MAX_STUBS) {
        strcpy(stub_names[nstubs], symbol);
        fn = stubs[nstubs++];
    }
    pthread_mutex_unlock(&lock);
    return fn;
}

/* ---------- device attributes of a plausible GPU ---------- */

#define CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34
#define CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID 50
#define CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103

/* An H100-like device (compute capability 9.0, 132 multiprocessors), every device at its own
 * PCI bus; 0 for anything not listed (no textures, no memory pools, no multicast). */
static const int attributes[][2] = {
    {1, 1024}, {2, 1024}, {3, 1024}, {4, 64}, {5, 2147483647}, {6, 65535}, {7, 65535},
    {8, 49152}, {9, 65536}, {10, 32}, {11, 2147483647}, {12, 65536}, {13, 1980000}, {14, 512},
    {15, 1}, {16, 132}, {19, 1}, {30, 512}, {31, 1}, {36, 2619000}, {37, 5120}, {38, 52428800},
    {39, 2048}, {40, 3}, {41, 1}, {51, 32}, {75, 9}, {76, 0}, {78, 1}, {79, 1}, {80, 1},
    {81, 233472}, {82, 65536}, {83, 1}, {86, 0}, {87, 2}, {90, 1}, {91, 1}, {95, 1}, {97, 232448},
    {99, 1}, {106, 32}, {108, 32505856}, {109, 134213632}, {111, 1024}, {120, 1}, {126, 4}, {131, -1}, {134, -1},
};

static int device_attribute(int attr, int d) {
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x10 + d;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return !no_vmm();
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return !no_vmm() && !no_posix_fd();
    default:
        for (size_t i = 0; i < sizeof attributes / sizeof attributes[0]; i++)
            if (attributes[i][0] == attr) return attributes[i][1];
        return 0;
    }
}

/* ---------- entry points beyond memory ---------- */

#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NO_BINARY_FOR_GPU 209

static CUresult s_cuModuleGetLoadingMode(int *mode) {
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    *mode = 2; /* CU_MODULE_LAZY_LOADING: modules load at first use, and no kernel is ever used */
    return CUDA_SUCCESS;
}

/* No kernel runs here: loading one answers as a driver with no image for this GPU. */
static CUresult s_no_kernel_image(void) { return CUDA_ERROR_NO_BINARY_FOR_GPU; }

/* ----- contexts and devices ----- */

static CUresult s_cuCtxGetFlags(unsigned *flags) {
    CUresult e = need_ctx();
    if (!e && !flags) e = CUDA_ERROR_INVALID_VALUE;
    if (!e) *flags = 0;
    return e;
}

static CUresult s_cuCtxSetFlags(unsigned flags) {
    (void)flags;
    return need_ctx();
}

/* cudaLimitStackSize, PrintfFifoSize, MallocHeapSize, DevRuntimeSyncDepth,
 * DevRuntimePendingLaunchCount, MaxL2FetchGranularity, PersistingL2CacheSize */
static CUresult s_cuCtxGetLimit(size_t *value, int limit) {
    static const size_t limits[] = {1024, 1 << 20, 8 << 20, 2, 2048, 64, 0};
    CUresult e = need_ctx();
    if (e) return e;
    if (!value || limit < 0 || limit >= (int)(sizeof limits / sizeof limits[0])) return CUDA_ERROR_INVALID_VALUE;
    *value = limits[limit];
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxSetLimit(int limit, size_t value) {
    (void)limit, (void)value;
    return need_ctx();
}

static CUresult s_cuCtxGetCacheConfig(int *config) {
    CUresult e = need_ctx();
    if (!e && !config) e = CUDA_ERROR_INVALID_VALUE;
    if (!e) *config = 0; /* CU_FUNC_CACHE_PREFER_NONE */
    return e;
}

static CUresult s_cuCtxSetCacheConfig(int config) {
    (void)config;
    return need_ctx();
}

static CUresult s_cuCtxGetApiVersion(CUcontext c, unsigned *version) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    if (!c) c = current();
    if (usable(c)) return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020;
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxGetId(CUcontext c, unsigned long long *id) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    if (!c) c = current();
    if (usable(c)) return CUDA_ERROR_INVALID_CONTEXT;
    *id = (unsigned long long)(c - ctxs) + 1;
    return CUDA_SUCCESS;
}

static CUresult s_cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    CUresult e = need_ctx();
    if (e) return e;
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return CUDA_SUCCESS;
}

static CUresult s_succeed_in_context(void) { return need_ctx(); }

static CUresult s_cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned flags) {
    (void)flags;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return d < 0 || d >= ndevices ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

static CUresult s_cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (!id || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(id, (size_t)len, "%08x:%02x:%02x.0", device_attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d),
             device_attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d), device_attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d));
    return CUDA_SUCCESS;
}

static CUresult s_cuDeviceGetByPCIBusId(CUdevice *d, const char *id) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    unsigned domain = 0, bus = 0, device = 0;
    if (!d || !id || (sscanf(id, "%x:%x:%x", &domain, &bus, &device) != 3 && sscanf(id, "%x:%x", &bus, &device) != 2))
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < ndevices; i++)
        if ((int)bus == device_attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, i)) {
            *d = i;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_DEVICE;
}

/* CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, ACCESS_SUPPORTED, NATIVE_ATOMIC_SUPPORTED,
 * CUDA_ARRAY_ACCESS_SUPPORTED: peers reach each other's memory (cuDeviceCanAccessPeer). */
static CUresult s_cuDeviceGetP2PAttribute(int *value, int attr, CUdevice src, CUdevice dst) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!value || attr < 1 || attr > 4) return CUDA_ERROR_INVALID_VALUE;
    if (src < 0 || src >= ndevices || dst < 0 || dst >= ndevices || src == dst) return CUDA_ERROR_INVALID_DEVICE;
    *value = attr == 2;
    return CUDA_SUCCESS;
}

/* ----- streams: handles only (fakecuda.c); one global queue ----- */

static CUresult s_cuStreamCreateWithPriority(CUstream *s, unsigned flags, int priority) {
    (void)priority;
    return s_cuStreamCreate(s, flags);
}

static CUresult stream_check(CUstream s) { return s ? (initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED) : need_ctx(); }

/* Work is done when a stream is asked: the queue runs (as if the GPU were that fast). */
static CUresult s_cuStreamQuery(CUstream s) {
    CUresult e = stream_check(s);
    if (e) return e;
    pthread_mutex_lock(&lock);
    run_queue();
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static CUresult s_cuStreamWaitEvent(CUstream s, void *event, unsigned flags) {
    (void)event, (void)flags;
    return stream_check(s);
}

static CUresult s_cuStreamGetPriority(CUstream s, int *priority) {
    CUresult e = stream_check(s);
    if (!e && !priority) e = CUDA_ERROR_INVALID_VALUE;
    if (!e) *priority = 0;
    return e;
}

static CUresult s_cuStreamGetFlags(CUstream s, unsigned *flags) {
    CUresult e = stream_check(s);
    if (!e && !flags) e = CUDA_ERROR_INVALID_VALUE;
    if (!e) *flags = 0;
    return e;
}

static CUresult s_cuStreamGetId(CUstream s, unsigned long long *id) {
    CUresult e = stream_check(s);
    if (!e && !id) e = CUDA_ERROR_INVALID_VALUE;
    if (!e) *id = (unsigned long long)(uintptr_t)s;
    return e;
}

static CUresult s_cuStreamGetCtx(CUstream s, CUcontext *c) {
    CUresult e = stream_check(s);
    if (!e && !c) e = CUDA_ERROR_INVALID_VALUE;
    if (!e) *c = current(); /* streams are not tied to contexts here */
    return e;
}

static CUresult s_cuStreamGetDevice(CUstream s, CUdevice *d) {
    CUresult e = need_ctx();
    (void)s;
    if (!e && !d) e = CUDA_ERROR_INVALID_VALUE;
    if (!e) *d = current()->dev;
    return e;
}

/* No stream is ever capturing a graph. */
static CUresult s_cuStreamIsCapturing(CUstream s, int *status) {
    CUresult e = stream_check(s);
    if (!e && !status) e = CUDA_ERROR_INVALID_VALUE;
    if (!e) *status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
    return e;
}

static CUresult s_cuStreamGetCaptureInfo(CUstream s, int *status, unsigned long long *id, void *graph, void *deps, void *edges, size_t *ndeps) {
    (void)graph, (void)deps, (void)edges;
    CUresult e = stream_check(s);
    if (e) return e;
    if (status) *status = 0;
    if (id) *id = 0;
    if (ndeps) *ndeps = 0;
    return CUDA_SUCCESS;
}

static CUresult s_cuThreadExchangeStreamCaptureMode(int *mode) {
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    int old = capture_mode_of_thread;
    capture_mode_of_thread = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* One capture at a time, recorded for what other threads may call meanwhile (see
 * capture_forbids_call); the graph is a token. The end of a capture begun in the global mode
 * lowers that count: the mode is kept per stream as one word, enough for one capture. */
static int capture_was_global;

static CUresult s_cuStreamBeginCapture_v2(CUstream s, int mode) {
    CUresult e = stream_check(s);
    if (e) return e;
    pthread_mutex_lock(&lock);
    captures++;
    capture_was_global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (capture_was_global) global_captures++;
    capture_invalidated = 0;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* CUDA 10.0's spelling: the global mode. */
static CUresult s_cuStreamBeginCapture(CUstream s) {
    return s_cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

static CUresult s_cuStreamEndCapture(CUstream s, void **graph) {
    CUresult e = stream_check(s);
    if (e) return e;
    pthread_mutex_lock(&lock);
    if (captures > 0) captures--;
    if (capture_was_global && global_captures > 0) global_captures--;
    int invalidated = capture_invalidated;
    pthread_mutex_unlock(&lock);
    if (graph) *graph = invalidated ? NULL : (void *)0x6a;
    return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

/* ----- events: completed when recorded (the queue runs when they are asked) ----- */

#define MAX_EVENTS 4096
#define CU_EVENT_DISABLE_TIMING 2
#define CU_EVENT_INTERPROCESS 4
static struct fake_event { int used; unsigned flags; int recorded; } events[MAX_EVENTS];

static struct fake_event *event_of(void *e) {
    struct fake_event *ev = e;
    return ev >= events && ev < events + MAX_EVENTS && ((uintptr_t)ev - (uintptr_t)events) % sizeof *ev == 0 && ev->used ? ev : NULL;
}

static CUresult new_event(void **out, unsigned flags) {
    CUresult e = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_EVENTS; i++)
        if (!events[i].used) {
            events[i] = (struct fake_event){1, flags, 0};
            *out = &events[i];
            e = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuEventCreate(void **out, unsigned flags) {
    CUresult e = need_ctx();
    if (e) return e;
    if (!out || ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))) return CUDA_ERROR_INVALID_VALUE;
    return new_event(out, flags);
}

static CUresult s_cuEventDestroy(void *e) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct fake_event *ev = event_of(e);
    if (ev) ev->used = 0;
    pthread_mutex_unlock(&lock);
    return ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult s_cuEventRecord(void *e, CUstream s) {
    CUresult r = stream_check(s);
    if (r) return r;
    pthread_mutex_lock(&lock);
    struct fake_event *ev = event_of(e);
    if (ev) ev->recorded = 1;
    pthread_mutex_unlock(&lock);
    return ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult s_cuEventRecordWithFlags(void *e, CUstream s, unsigned flags) {
    (void)flags;
    return s_cuEventRecord(e, s);
}

static CUresult s_cuEventSynchronize(void *e) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct fake_event *ev = event_of(e);
    if (ev) run_queue();
    pthread_mutex_unlock(&lock);
    return ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult s_cuEventQuery(void *e) { return s_cuEventSynchronize(e); }

static CUresult s_cuEventElapsedTime(float *ms, void *start, void *end) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct fake_event *a = event_of(start), *b = event_of(end);
    CUresult e = !a || !b || ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) ? CUDA_ERROR_INVALID_HANDLE
                 : !a->recorded || !b->recorded                                ? CUDA_ERROR_NOT_READY
                                                                               : CUDA_SUCCESS;
    pthread_mutex_unlock(&lock);
    if (!e) *ms = 0.0f;
    return e;
}

/* An interprocess event's handle names it; opened in another process it is a fresh event there
 * (work is complete when recorded, so waiting on it never waits). */
#define IPC_EVENT_MAGIC 0x46414b454556454eULL /* "FAKEEVEN" */
static CUresult s_cuIpcGetEventHandle(CUipcMemHandle *h, void *e) {
    CUresult r = need_ctx();
    if (r) return r;
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct fake_event *ev = event_of(e);
    if (!ev) r = CUDA_ERROR_INVALID_HANDLE;
    else if (!(ev->flags & CU_EVENT_INTERPROCESS)) r = CUDA_ERROR_INVALID_VALUE;
    else {
        uint64_t id[3] = {IPC_EVENT_MAGIC, (uint64_t)getpid(), (uint64_t)(ev - events)};
        memset(h, 0, sizeof *h);
        memcpy(h->reserved, id, sizeof id);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult s_cuIpcOpenEventHandle(void **out, CUipcMemHandle h) {
    CUresult r = need_ctx();
    if (r) return r;
    uint64_t id[3];
    memcpy(id, h.reserved, sizeof id);
    if (!out || id[0] != IPC_EVENT_MAGIC || id[1] == (uint64_t)getpid()) return CUDA_ERROR_INVALID_VALUE;
    return new_event(out, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
}

/* ----- copies and memsets: the queue runs first, then the bytes move ----- */

/* Whether [p, p + n) is memory a copy may touch on the device side: inside one live
 * allocation (device, stream-ordered, managed, pinned host, opened by IPC), or tiled by
 * mappings of the virtual memory API that some device may access. Caller holds the lock. */
static int device_range(uintptr_t p, size_t n) {
    int i = find_containing(p, MEMORY);
    if (i < 0 || !n) return i >= 0;
    if (allocs[i].kind != K_VMM_MAP) return n <= allocs[i].size - (p - allocs[i].base);
    for (uintptr_t at = p, end = p + n; at < end;) {
        int k = find_containing(at, M(K_VMM_MAP));
        if (k < 0 || !allocs[k].access) return 0;
        at = allocs[k].base + allocs[k].size;
    }
    return 1;
}

/* Whether p lies in memory the stand-in handed out (the other side of cuMemcpy is host memory). */
static int is_device(uintptr_t p) { return find_containing(p, MEMORY) >= 0; }

enum { ANY = 0, DEV = 1, HOST = 2 };
/* Copies n bytes after the queued work, checking each side that must be device memory. */
static CUresult copy(uintptr_t dst, int dst_kind, uintptr_t src, int src_kind, size_t n) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!n) return CUDA_SUCCESS;
    if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
    CUresult e = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    run_queue();
    if (dst_kind == ANY) dst_kind = is_device(dst) ? DEV : HOST;
    if (src_kind == ANY) src_kind = is_device(src) ? DEV : HOST;
    if ((dst_kind == DEV && !device_range(dst, n)) || (src_kind == DEV && !device_range(src, n))) e = CUDA_ERROR_INVALID_VALUE;
    else memmove((void *)dst, (const void *)src, n);
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, ANY, s, ANY, n); }
static CUresult s_cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return copy(d, ANY, s, ANY, n); }
static CUresult s_cuMemcpyHtoD(CUdeviceptr d, const void *s, size_t n) { return copy(d, DEV, (uintptr_t)s, ANY, n); }
static CUresult s_cuMemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)st; return copy(d, DEV, (uintptr_t)s, ANY, n); }
static CUresult s_cuMemcpyDtoH(void *d, CUdeviceptr s, size_t n) { return copy((uintptr_t)d, ANY, s, DEV, n); }
static CUresult s_cuMemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return copy((uintptr_t)d, ANY, s, DEV, n); }
static CUresult s_cuMemcpyDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, DEV, s, DEV, n); }
static CUresult s_cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return copy(d, DEV, s, DEV, n); }
static CUresult s_cuMemcpyPeer(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) { (void)dc, (void)sc; return copy(d, DEV, s, DEV, n); }
static CUresult s_cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) {
    (void)dc, (void)sc, (void)st;
    return copy(d, DEV, s, DEV, n);
}

/* n elements of `width` bytes, each set to value, after the queued work. */
static CUresult memset_elements(CUdeviceptr d, unsigned value, size_t n, size_t width) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!n) return CUDA_SUCCESS;
    if (n > SIZE_MAX / width || d % width) return CUDA_ERROR_INVALID_VALUE;
    CUresult e = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    run_queue();
    if (!device_range(d, n * width)) e = CUDA_ERROR_INVALID_VALUE;
    else if (width == 1) memset((void *)(uintptr_t)d, (int)value, n);
    else
        for (size_t i = 0; i < n; i++) memcpy((char *)(uintptr_t)d + i * width, &value, width); /* little-endian: the low bytes */
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult s_cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { return memset_elements(d, v, n, 1); }
static CUresult s_cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)s; return memset_elements(d, v, n, 1); }
static CUresult s_cuMemsetD16(CUdeviceptr d, unsigned short v, size_t n) { return memset_elements(d, v, n, 2); }
static CUresult s_cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { (void)s; return memset_elements(d, v, n, 2); }
static CUresult s_cuMemsetD32(CUdeviceptr d, unsigned v, size_t n) { return memset_elements(d, v, n, 4); }
static CUresult s_cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) { (void)s; return memset_elements(d, v, n, 4); }

/* ----- pinned memory queries ----- */

static CUresult s_cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!d || flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int i = find_containing((uintptr_t)p, M(K_HOST));
    pthread_mutex_unlock(&lock);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

static CUresult s_cuMemHostGetFlags(unsigned *flags, void *p) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int i = find_containing((uintptr_t)p, M(K_HOST));
    pthread_mutex_unlock(&lock);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    return CUDA_SUCCESS;
}

/* ----- shareable handles of the virtual memory API (IPC of expandable segments) -----
 * A POSIX file descriptor names a handle's memory across processes, as NVIDIA's driver gives
 * (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; PyTorch's receiver gets the descriptor with
 * pidfd_getfd, tensormalloc's through a Unix socket). Here it is a duplicate of the handle's
 * memfd; an imported handle maps the same pages and counts against no device's memory a second
 * time. As NVIDIA documents, only memory created with that handle type requested
 * (CUmemAllocationProp.requestedHandleTypes) can be exported: other memory answers
 * CUDA_ERROR_INVALID_VALUE; a device without such handles (FAKECUDA_NO_POSIX_FD=1)
 * CUDA_ERROR_NOT_SUPPORTED. Fabric handles are refused as on a machine without a fabric. */

#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1

static CUresult s_cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type, unsigned long long flags) {
    CUresult e = vmm_entry();
    if (e) return e;
    if (!out || flags) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || no_posix_fd()) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    struct alloc *a = vmm_handle(h);
    if (a && !a->shareable) a = NULL;
    int fd = a ? fcntl(a->fd, F_DUPFD_CLOEXEC, 0) : -1;
    pthread_mutex_unlock(&lock);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

static CUresult s_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, int type) {
    CUresult e = vmm_entry();
    if (e) return e;
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    int given = (int)(intptr_t)os_handle;
    struct stat st;
    if (fstat(given, &st) != 0 || st.st_size <= 0 || !aligned((uint64_t)st.st_size)) return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(given, F_DUPFD_CLOEXEC, 0); /* the caller keeps and closes its descriptor */
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext c = current();
    pthread_mutex_lock(&lock);
    int slot = free_slot();
    if (slot < 0) e = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        allocs[slot] = (struct alloc){K_VMM_HANDLE, fd, c && known_ctx(c) ? c->dev : 0, 0, NULL, 0, (size_t)st.st_size, next_serial++};
        *h = (CUmemGenericAllocationHandle)slot + 1;
        vmm_calls++;
    }
    pthread_mutex_unlock(&lock);
    if (e) close(fd);
    return e;
}

static CUresult s_cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
    CUresult e = vmm_entry();
    if (e) return e;
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct alloc *a = vmm_handle(h);
    if (a) {
        memset(prop, 0, sizeof *prop);
        prop->type = 1; /* PINNED */
        prop->requestedHandleTypes = a->shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
        prop->location.type = 1; /* DEVICE */
        prop->location.id = a->dev;
    }
    pthread_mutex_unlock(&lock);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static const struct proc runtime_procs[] = {
    P("cuModuleGetLoadingMode", s_cuModuleGetLoadingMode),
    P("cuDeviceGetAttribute", s_cuDeviceGetAttribute),
    P("cuCtxGetFlags", s_cuCtxGetFlags),
    P("cuCtxSetFlags", s_cuCtxSetFlags),
    P("cuCtxGetLimit", s_cuCtxGetLimit),
    P("cuCtxSetLimit", s_cuCtxSetLimit),
    P("cuCtxGetCacheConfig", s_cuCtxGetCacheConfig),
    P("cuCtxSetCacheConfig", s_cuCtxSetCacheConfig),
    P("cuCtxGetApiVersion", s_cuCtxGetApiVersion),
    P("cuCtxGetId", s_cuCtxGetId),
    P("cuCtxGetStreamPriorityRange", s_cuCtxGetStreamPriorityRange),
    P("cuCtxResetPersistingL2Cache", s_succeed_in_context),
    P("cuDevicePrimaryCtxSetFlags", s_cuDevicePrimaryCtxSetFlags),
    P("cuDeviceGetPCIBusId", s_cuDeviceGetPCIBusId),
    P("cuDeviceGetByPCIBusId", s_cuDeviceGetByPCIBusId),
    P("cuDeviceGetP2PAttribute", s_cuDeviceGetP2PAttribute),
    P("cuStreamCreateWithPriority", s_cuStreamCreateWithPriority),
    P("cuStreamQuery", s_cuStreamQuery),
    P("cuStreamWaitEvent", s_cuStreamWaitEvent),
    P("cuStreamGetPriority", s_cuStreamGetPriority),
    P("cuStreamGetFlags", s_cuStreamGetFlags),
    P("cuStreamGetId", s_cuStreamGetId),
    P("cuStreamGetCtx", s_cuStreamGetCtx),
    P("cuStreamGetDevice", s_cuStreamGetDevice),
    P("cuStreamIsCapturing", s_cuStreamIsCapturing),
    P("cuStreamGetCaptureInfo", s_cuStreamGetCaptureInfo),
    P("cuThreadExchangeStreamCaptureMode", s_cuThreadExchangeStreamCaptureMode),
    P("cuStreamBeginCapture", s_cuStreamBeginCapture_v2),
    P("cuStreamEndCapture", s_cuStreamEndCapture),
    P("cuEventCreate", s_cuEventCreate),
    P("cuEventDestroy", s_cuEventDestroy),
    P("cuEventRecord", s_cuEventRecord),
    P("cuEventRecordWithFlags", s_cuEventRecordWithFlags),
    P("cuEventQuery", s_cuEventQuery),
    P("cuEventSynchronize", s_cuEventSynchronize),
    P("cuEventElapsedTime", s_cuEventElapsedTime),
    P("cuIpcGetEventHandle", s_cuIpcGetEventHandle),
    P("cuIpcOpenEventHandle", s_cuIpcOpenEventHandle),
    P("cuMemcpy", s_cuMemcpy),
    P("cuMemcpyAsync", s_cuMemcpyAsync),
    P("cuMemcpyHtoD", s_cuMemcpyHtoD),
    P("cuMemcpyHtoDAsync", s_cuMemcpyHtoDAsync),
    P("cuMemcpyDtoH", s_cuMemcpyDtoH),
    P("cuMemcpyDtoHAsync", s_cuMemcpyDtoHAsync),
    P("cuMemcpyDtoD", s_cuMemcpyDtoD),
    P("cuMemcpyDtoDAsync", s_cuMemcpyDtoDAsync),
    P("cuMemcpyPeer", s_cuMemcpyPeer),
    P("cuMemcpyPeerAsync", s_cuMemcpyPeerAsync),
    P("cuMemsetD8", s_cuMemsetD8),
    P("cuMemsetD8Async", s_cuMemsetD8Async),
    P("cuMemsetD16", s_cuMemsetD16),
    P("cuMemsetD16Async", s_cuMemsetD16Async),
    P("cuMemsetD32", s_cuMemsetD32),
    P("cuMemsetD32Async", s_cuMemsetD32Async),
    P("cuMemHostGetDevicePointer", s_cuMemHostGetDevicePointer),
    P("cuMemExportToShareableHandle", s_cuMemExportToShareableHandle),
    P("cuMemImportFromShareableHandle", s_cuMemImportFromShareableHandle),
    P("cuMemGetAllocationPropertiesFromHandle", s_cuMemGetAllocationPropertiesFromHandle),
    P("cuMemHostGetFlags", s_cuMemHostGetFlags),
    P("cuLibraryLoadData", s_no_kernel_image),
    P("cuLibraryLoadFromFile", s_no_kernel_image),
    P("cuModuleLoadData", s_no_kernel_image),
    P("cuModuleLoadFatBinary", s_no_kernel_image),
    P("cuModuleLoad", s_no_kernel_image),
};

/* The entry point of this file that `symbol` names, or a stub for a driver name the stand-in
 * does not model; NULL for any other name. */
static void *runtime_proc(const char *symbol) {
    for (size_t i = 0; i < sizeof runtime_procs / sizeof runtime_procs[0]; i++)
        if (strcmp(runtime_procs[i].name, symbol) == 0) return runtime_procs[i].fn;
    return stub_for(symbol);
}
