/* SIMULATOR: the part of the stand-in CUDA driver (c/fakecuda.c, not NVIDIA's driver) that NVIDIA's real runtime needs. */
/* Included by fakecuda.c (one translation unit: it shares the driver's static state). What
 * NVIDIA's libcudart (12.x and 13.x, as PyTorch and CuPy ship it) asks of a driver beyond the
 * memory calls the tests model:
 * - the private tables behind cuGetExportTable, found by a 16-byte id: context-local storage
 *   (the runtime keeps its per-context state there), the buffers its tools hooks point to, a
 *   context check, and an integrity check whose answer the runtime verifies: an HMAC over MD2
 *   of the driver's version, the caller's version, pid and thread, the tables' addresses, the
 *   time and every device's UUID and PCI location (what public projects found, ZLUDA's among
 *   them: written here from the description);
 * - device attributes of a plausible GPU, events, stream queries, copies and memsets (after the
 *   queued work, each device side checked against live allocations), shareable handles of the
 *   virtual memory API, interprocess events, and module and library loads that answer "no
 *   kernel image" since no kernel runs;
 * - every other driver name the runtime asks cuGetProcAddress for gets a stub that answers
 *   CUDA_ERROR_NOT_SUPPORTED (FAKECUDA_TRACE=1 prints each stub called and each table slot
 *   the stand-in does not implement). */

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

/* ---------- the private tables ---------- */

typedef struct { unsigned char bytes[16]; } fake_uuid;

static CUresult table_slot_missing(const char *table, int slot) {
    if (tracing()) fprintf(stderr, "fakecuda: private table %s slot %d called\n", table, slot);
    return CUDA_ERROR_NOT_SUPPORTED;
}
#define SLOT(t, i) static CUresult t##_##i(void) { return table_slot_missing(#t, i); }

/* Context-local storage: the runtime keeps each context's state under its own key. */
#define MAX_CLS 64
static struct cls { CUcontext ctx; void *key; void *value; void (*dtor)(CUcontext, void *, void *); } cls[MAX_CLS];

static CUresult cls_context(CUcontext *c) {
    if (*c) return known_ctx(*c) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    *c = current();
    return *c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult cls_put(CUcontext c, void *key, void *value, void (*dtor)(CUcontext, void *, void *)) {
    CUresult e = cls_context(&c);
    if (e) return e;
    pthread_mutex_lock(&lock);
    struct cls *free_entry = NULL, *found = NULL;
    for (int i = 0; i < MAX_CLS && !found; i++) {
        if (cls[i].ctx == c && cls[i].key == key) found = &cls[i];
        else if (!cls[i].ctx && !free_entry) free_entry = &cls[i];
    }
    if (!found) found = free_entry;
    if (found) *found = (struct cls){c, key, value, dtor};
    pthread_mutex_unlock(&lock);
    if (tracing()) fprintf(stderr, "fakecuda: cls put %p %p -> %p\n", (void *)c, key, value);
    return found ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult cls_delete(CUcontext c, void *key) {
    CUresult e = cls_context(&c);
    if (e) return e;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CLS; i++)
        if (cls[i].ctx == c && cls[i].key == key) cls[i] = (struct cls){0};
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static CUresult cls_get(void **value, CUcontext c, void *key) {
    CUresult e = cls_context(&c);
    if (e) return e;
    e = 400; /* CUDA_ERROR_INVALID_HANDLE: nothing stored */
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CLS; i++)
        if (cls[i].ctx == c && cls[i].key == key) {
            *value = cls[i].value;
            e = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    if (tracing()) fprintf(stderr, "fakecuda: cls get %p %p -> %d\n", (void *)c, key, e);
    return e;
}

/* A context's end: its entries go (under the lock) and their destructors run after it, as the
 * runtime's callbacks call the driver. */
static struct cls dying[MAX_CLS];
static int ndying;

static void cls_forget(CUcontext c) {
    for (int i = 0; i < MAX_CLS; i++)
        if (cls[i].ctx == c) {
            if (cls[i].dtor && ndying < MAX_CLS) dying[ndying++] = cls[i];
            cls[i] = (struct cls){0};
        }
}

static void cls_run_destructors(void) {
    for (;;) {
        pthread_mutex_lock(&lock);
        struct cls d = ndying ? dying[--ndying] : (struct cls){0};
        pthread_mutex_unlock(&lock);
        if (!d.ctx) return;
        d.dtor(d.ctx, d.key, d.value);
    }
}

SLOT(cls, 3)
static const void *const cls_table[] = {(void *)cls_put, (void *)cls_delete, (void *)cls_get, (void *)cls_3};

/* The runtime's interface table. */
static CUresult cudart_primary_context(CUcontext *pctx, CUdevice d) {
    if (tracing()) fprintf(stderr, "fakecuda: cudart primary context %d\n", d);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *pctx = &ctxs[d];
    return CUDA_SUCCESS;
}
/* Slot 12 loads the PTX compilers in NVIDIA's driver: here there is nothing to load. */
static CUresult cudart_load_compilers(void) { return CUDA_SUCCESS; }
SLOT(cudart, 1) SLOT(cudart, 3) SLOT(cudart, 4) SLOT(cudart, 5) SLOT(cudart, 6) SLOT(cudart, 7)
SLOT(cudart, 8) SLOT(cudart, 9) SLOT(cudart, 10) SLOT(cudart, 11) SLOT(cudart, 13)
SLOT(cudart, 14) SLOT(cudart, 15)
#define CUDART_SLOTS 16
static const void *const cudart_table[CUDART_SLOTS] = {
    (void *)(CUDART_SLOTS * sizeof(void *)), (void *)cudart_1, (void *)cudart_primary_context, (void *)cudart_3,
    (void *)cudart_4, (void *)cudart_5, (void *)cudart_6, (void *)cudart_7, (void *)cudart_8, (void *)cudart_9,
    (void *)cudart_10, (void *)cudart_11, (void *)cudart_load_compilers, (void *)cudart_13, (void *)cudart_14, (void *)cudart_15,
};

/* Buffers the runtime's tools hooks point to. */
static uint32_t hooks_buffer1[1024], hooks_buffer2[14];
static void hooks_buffer_1(void **p, size_t *n) { *p = hooks_buffer1, *n = sizeof hooks_buffer1 / sizeof hooks_buffer1[0]; }
static void hooks_buffer_2(void **p, size_t *n) { *p = hooks_buffer2, *n = sizeof hooks_buffer2 / sizeof hooks_buffer2[0]; }
SLOT(hooks, 1) SLOT(hooks, 3) SLOT(hooks, 4) SLOT(hooks, 5) SLOT(hooks, 7) SLOT(hooks, 8) SLOT(hooks, 9)
#define HOOKS_SLOTS 10
static const void *const hooks_table[HOOKS_SLOTS] = {
    (void *)(HOOKS_SLOTS * sizeof(void *)), (void *)hooks_1, (void *)hooks_buffer_1, (void *)hooks_3, (void *)hooks_4,
    (void *)hooks_5, (void *)hooks_buffer_2, (void *)hooks_7, (void *)hooks_8, (void *)hooks_9,
};

SLOT(tls, 1) SLOT(tls, 2) SLOT(tls, 3) SLOT(tls, 4) SLOT(tls, 5)
#define TLS_SLOTS 6
static const void *const tls_table[TLS_SLOTS] = {
    (void *)(TLS_SLOTS * sizeof(void *)), (void *)tls_1, (void *)tls_2, (void *)tls_3, (void *)tls_4, (void *)tls_5,
};

static CUresult context_check(CUcontext c, uint32_t *result, const void **other) {
    (void)c, (void)other;
    if (result) *result = 0;
    return CUDA_SUCCESS;
}
static uint32_t context_check_3(void) { return 0; }
SLOT(checks, 1) SLOT(checks, 4) SLOT(checks, 5)
#define CHECKS_SLOTS 6
static const void *const checks_table[CHECKS_SLOTS] = {
    (void *)(CHECKS_SLOTS * sizeof(void *)), (void *)checks_1, (void *)context_check, (void *)context_check_3,
    (void *)checks_4, (void *)checks_5,
};

/* ----- the integrity check: HMAC over MD2 (RFC 1319) with a fixed key ----- */

static const unsigned char md2_s[256] = {
    0x29, 0x2e, 0x43, 0xc9, 0xa2, 0xd8, 0x7c, 0x01, 0x3d, 0x36, 0x54, 0xa1, 0xec, 0xf0, 0x06, 0x13,
    0x62, 0xa7, 0x05, 0xf3, 0xc0, 0xc7, 0x73, 0x8c, 0x98, 0x93, 0x2b, 0xd9, 0xbc, 0x4c, 0x82, 0xca,
    0x1e, 0x9b, 0x57, 0x3c, 0xfd, 0xd4, 0xe0, 0x16, 0x67, 0x42, 0x6f, 0x18, 0x8a, 0x17, 0xe5, 0x12,
    0xbe, 0x4e, 0xc4, 0xd6, 0xda, 0x9e, 0xde, 0x49, 0xa0, 0xfb, 0xf5, 0x8e, 0xbb, 0x2f, 0xee, 0x7a,
    0xa9, 0x68, 0x79, 0x91, 0x15, 0xb2, 0x07, 0x3f, 0x94, 0xc2, 0x10, 0x89, 0x0b, 0x22, 0x5f, 0x21,
    0x80, 0x7f, 0x5d, 0x9a, 0x5a, 0x90, 0x32, 0x27, 0x35, 0x3e, 0xcc, 0xe7, 0xbf, 0xf7, 0x97, 0x03,
    0xff, 0x19, 0x30, 0xb3, 0x48, 0xa5, 0xb5, 0xd1, 0xd7, 0x5e, 0x92, 0x2a, 0xac, 0x56, 0xaa, 0xc6,
    0x4f, 0xb8, 0x38, 0xd2, 0x96, 0xa4, 0x7d, 0xb6, 0x76, 0xfc, 0x6b, 0xe2, 0x9c, 0x74, 0x04, 0xf1,
    0x45, 0x9d, 0x70, 0x59, 0x64, 0x71, 0x87, 0x20, 0x86, 0x5b, 0xcf, 0x65, 0xe6, 0x2d, 0xa8, 0x02,
    0x1b, 0x60, 0x25, 0xad, 0xae, 0xb0, 0xb9, 0xf6, 0x1c, 0x46, 0x61, 0x69, 0x34, 0x40, 0x7e, 0x0f,
    0x55, 0x47, 0xa3, 0x23, 0xdd, 0x51, 0xaf, 0x3a, 0xc3, 0x5c, 0xf9, 0xce, 0xba, 0xc5, 0xea, 0x26,
    0x2c, 0x53, 0x0d, 0x6e, 0x85, 0x28, 0x84, 0x09, 0xd3, 0xdf, 0xcd, 0xf4, 0x41, 0x81, 0x4d, 0x52,
    0x6a, 0xdc, 0x37, 0xc8, 0x6c, 0xc1, 0xab, 0xfa, 0x24, 0xe1, 0x7b, 0x08, 0x0c, 0xbd, 0xb1, 0x4a,
    0x78, 0x88, 0x95, 0x8b, 0xe3, 0x63, 0xe8, 0x6d, 0xe9, 0xcb, 0xd5, 0xfe, 0x3b, 0x00, 0x1d, 0x39,
    0xf2, 0xef, 0xb7, 0x0e, 0x66, 0x58, 0xd0, 0xe4, 0xa6, 0x77, 0x72, 0xf8, 0xeb, 0x75, 0x4b, 0x0a,
    0x31, 0x44, 0x50, 0xb4, 0x8f, 0xed, 0x1f, 0x1a, 0xdb, 0x99, 0x8d, 0x33, 0x9f, 0x11, 0x83, 0x14,
};

struct md2 { unsigned char x[48], checksum[16], block[16]; unsigned n; };

static void md2_compress(struct md2 *h) {
    unsigned char l = h->checksum[15];
    for (int j = 0; j < 16; j++) {
        h->x[16 + j] = h->block[j];
        h->x[32 + j] = h->x[j] ^ h->block[j];
        l = h->checksum[j] ^= md2_s[h->block[j] ^ l];
    }
    unsigned char t = 0;
    for (int j = 0; j < 18; j++) {
        for (int k = 0; k < 48; k++) t = h->x[k] ^= md2_s[t];
        t = (unsigned char)(t + j);
    }
}

static void md2_update(struct md2 *h, const void *data, size_t n, unsigned char xor_with) {
    for (size_t i = 0; i < n; i++) {
        h->block[h->n++] = ((const unsigned char *)data)[i] ^ xor_with;
        if (h->n == 16) {
            md2_compress(h);
            h->n = 0;
        }
    }
}

static void md2_final(struct md2 *h, unsigned char out[16]) {
    unsigned char pad = (unsigned char)(16 - h->n);
    for (unsigned i = 0; i < pad; i++) md2_update(h, &pad, 1, 0);
    unsigned char sum[16];
    memcpy(sum, h->checksum, 16);
    md2_update(h, sum, 16, 0);
    memcpy(out, h->x, 16);
}

/* The key of the runtime's check (itself the MD2 digest of a fixed input, as found). */
static const unsigned char integrity_key[16] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};

struct integrity_input {
    uint32_t driver_version, caller_version, pid, thread;
    const void *cudart_table, *integrity_table, *check_fn;
    uint64_t seconds;
};
struct integrity_device { unsigned char uuid[16]; int32_t pci_domain, pci_bus, pci_device; };

static int device_attribute(int attr, int d);
#define CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34
#define CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID 50

static CUresult integrity_check(uint32_t version, uint64_t seconds, uint64_t out[2]);
#define INTEGRITY_SLOTS 3
SLOT(integrity, 2)
static const void *const integrity_table[INTEGRITY_SLOTS] = {
    (void *)(INTEGRITY_SLOTS * sizeof(void *)), (void *)integrity_check, (void *)integrity_2,
};

static CUresult integrity_check(uint32_t version, uint64_t seconds, uint64_t out[2]) {
    if (tracing()) fprintf(stderr, "fakecuda: integrity check %u %llu\n", version, (unsigned long long)seconds);
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (version % 10 < 2) { /* fixed answers for the first two versions of the check */
        out[0] = version % 10 ? 0x1841181C03CB675CULL : 0x3341181C03CB675CULL;
        out[1] = 0x8ED383AA1F4CD1E8ULL;
        return CUDA_SUCCESS;
    }
    struct integrity_input in = {FAKE_DRIVER_VERSION, version, (uint32_t)getpid(), (uint32_t)pthread_self(),
                                 cudart_table, integrity_table, integrity_table[1], seconds};
    struct md2 inner = {0}, outer = {0};
    unsigned char digest[16];
    md2_update(&inner, integrity_key, 16, 0x36);
    md2_update(&inner, &in, sizeof in, 0);
    for (int d = 0; d < ndevices; d++) {
        struct integrity_device dev = {{0}, device_attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d),
                                       device_attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d), device_attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d)};
        s_cuDeviceGetUuid((char *)dev.uuid, d);
        md2_update(&inner, &dev, sizeof dev, 0);
    }
    md2_final(&inner, digest);
    md2_update(&outer, integrity_key, 16, 0x5c);
    md2_update(&outer, digest, 16, 0);
    md2_final(&outer, digest);
    memcpy(out, digest, 16);
    return CUDA_SUCCESS;
}

static const struct export_table { fake_uuid id; const char *name; const void *const *table; } export_tables[] = {
    {{{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}}, "cudart", cudart_table},
    {{{0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc}}, "tools tls", tls_table},
    {{{0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66}}, "tools hooks", hooks_table},
    {{{0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93}}, "context storage", cls_table},
    {{{0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e}}, "context checks", checks_table},
    {{{0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}}, "integrity", integrity_table},
};

static CUresult private_table(const void **table, const void *id) {
    if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof export_tables / sizeof export_tables[0]; i++)
        if (memcmp(export_tables[i].id.bytes, id, 16) == 0) {
            if (tracing()) fprintf(stderr, "fakecuda: private table %s\n", export_tables[i].name);
            *table = export_tables[i].table;
            return CUDA_SUCCESS;
        }
    if (tracing()) {
        fprintf(stderr, "fakecuda: unknown private table ");
        for (int i = 0; i < 16; i++) fprintf(stderr, "%02x", ((const unsigned char *)id)[i]);
        fprintf(stderr, "\n");
    }
    *table = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---------- device attributes of a plausible GPU ---------- */

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
    static __thread __attribute__((tls_model("initial-exec"))) int thread_mode;
    int old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
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
 * (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; the receiver gets the descriptor with
 * pidfd_getfd). Here it is a duplicate of the handle's memfd; an imported handle maps the same
 * pages and counts against no device's memory a second time. Fabric handles are refused as on
 * a machine without a fabric. */

#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1

static CUresult s_cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type, unsigned long long flags) {
    CUresult e = vmm_entry();
    if (e) return e;
    if (!out || flags) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    struct alloc *a = vmm_handle(h);
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
        prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
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
