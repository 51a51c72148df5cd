/* SIMULATOR: the private tables NVIDIA's runtime asks the stand-in CUDA driver for (c/fakecuda.c; not NVIDIA's driver). */
/* Included by fakecuda.c after fakecuda_runtime.c (one translation unit). cuGetExportTable finds
 * a table by a 16-byte id; each starts with its size in bytes where the runtime reads one, then
 * function pointers: context-local storage (the runtime keeps each context's state there; a
 * context's end runs the destructors), the buffers its tools hooks point to, a context check, the
 * runtime interface (the primary context; no compilers to load), and the integrity check whose
 * answer the runtime verifies before any device call: an HMAC over MD2 of the driver's version,
 * the caller's version, pid and thread, the tables' addresses, the time and every device's UUID
 * and PCI location (what public projects found, ZLUDA's among them; written here from that
 * description). A slot the stand-in does not implement answers CUDA_ERROR_NOT_SUPPORTED, named
 * on stderr under FAKECUDA_TRACE=1. */

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
