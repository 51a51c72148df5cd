/* Issue 18: binding the driver late and from many threads at once, over the stand-in driver
 * (fakecuda.c, a simulator). Built without -lcuda: the driver is loaded when a scenario says.
 * argv[1] names the scenario; each prints "SCENARIO ok ..." and passes without tensormalloc:
 *   lookups  200 look-ups of cu* names that do not exist (as the stub loaders of XLA and
 *            TensorFlow make for cuBLAS, cuDNN, cuFFT) before libcuda.so.1 is loaded; then the
 *            driver, loaded RTLD_GLOBAL, is called by symbol (as a library linked with -lcuda and
 *            loaded later calls it) and through its handle (as Numba and JAX do)
 *   threads  32 threads make the process's first driver calls at once (the driver loaded first)
 *   runtime-threads  the same with the runtime's first calls (libcudart.so.12 loaded first): it
 *            binds the driver through cuGetProcAddress while the threads race ours
 * Both print the stand-in's allocation count. */
#include <pthread.h>
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
    int (*info)(size_t *, size_t *);
    void (*counters)(struct fakecuda_counters *);
} D;

static void *sym(void *handle, const char *name) {
    void *p = dlsym(handle, name);
    CHECK(p != NULL);
    return p;
}

/* The driver's entry points as dlsym(handle) finds them. */
static void bind(void *handle) {
    D.init = (int (*)(unsigned))sym(handle, "cuInit");
    D.retain = (int (*)(CUcontext *, int))sym(handle, "cuDevicePrimaryCtxRetain");
    D.set_current = (int (*)(CUcontext))sym(handle, "cuCtxSetCurrent");
    D.alloc = (int (*)(CUdeviceptr *, size_t))sym(handle, "cuMemAlloc_v2");
    D.free = (int (*)(CUdeviceptr))sym(handle, "cuMemFree_v2");
    D.info = (int (*)(size_t *, size_t *))sym(handle, "cuMemGetInfo_v2");
    D.counters = (void (*)(struct fakecuda_counters *))sym(handle, "fakecuda_get_counters");
}

static void *load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    CHECK(lib != NULL);
    return lib;
}

static void current_primary(void) {
    CUcontext ctx = NULL;
    CHECK(D.init(0) == 0 && D.retain(&ctx, 0) == 0 && D.set_current(ctx) == 0);
}

static void pairs(int n) {
    for (int i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        int rc = D.alloc(&p, 32 * MB);
        if (rc) {
            printf("cuMemAlloc_v2 answered %d\n", rc);
            exit(1);
        }
        CHECK(p && D.free(p) == 0);
    }
}

static void lookups(void) {
    void *self = dlopen(NULL, RTLD_NOW);
    CHECK(self != NULL);
    for (int i = 0; i < 200; i++) {
        char name[64];
        snprintf(name, sizeof name, "cublasStubEntry%d", i);
        CHECK(dlsym(self, name) == NULL);
    }
    void *lib = load_driver();
    bind(RTLD_DEFAULT); /* by symbol: the first definition in the global scope */
    current_primary();
    pairs(100);
    bind(lib); /* by the driver's handle */
    pairs(100);
}

#define THREADS 32
static pthread_barrier_t start;

static void *first_calls(void *arg) {
    (void)arg;
    current_primary(); /* the driver's own entry points: not the ones a pool serves */
    pthread_barrier_wait(&start);
    size_t free_bytes = 0, total = 0;
    CUdeviceptr p = 0;
    int rc[3] = {D.info(&free_bytes, &total), D.alloc(&p, 1 * MB), -1};
    rc[2] = rc[1] ? -1 : D.free(p);
    if (rc[0] || rc[1] || rc[2]) {
        printf("first calls answered %d %d %d\n", rc[0], rc[1], rc[2]);
        exit(1);
    }
    return NULL;
}

static void threads(void) {
    load_driver();
    bind(RTLD_DEFAULT); /* by symbol, so that no look-up binds the driver before the threads */
    pthread_t t[THREADS];
    CHECK(pthread_barrier_init(&start, NULL, THREADS) == 0);
    for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, first_calls, NULL) == 0);
    for (int i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
}

static int (*rt_malloc)(void **, size_t);
static int (*rt_free)(void *);

static void *first_runtime_calls(void *arg) {
    (void)arg;
    pthread_barrier_wait(&start);
    void *p = NULL;
    int rc[2] = {rt_malloc(&p, 1 * MB), -1};
    rc[1] = rc[0] ? -1 : rt_free(p);
    if (rc[0] || rc[1]) {
        printf("first runtime calls answered %d %d\n", rc[0], rc[1]);
        exit(1);
    }
    return NULL;
}

static void runtime_threads(void) {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); /* where the runtime's dlopen finds it */
    CHECK(driver != NULL && dlopen("libcudart.so.12", RTLD_NOW | RTLD_GLOBAL) != NULL);
    rt_malloc = (int (*)(void **, size_t))sym(RTLD_DEFAULT, "cudaMalloc");
    rt_free = (int (*)(void *))sym(RTLD_DEFAULT, "cudaFree");
    pthread_t t[THREADS];
    CHECK(pthread_barrier_init(&start, NULL, THREADS) == 0);
    for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, first_runtime_calls, NULL) == 0);
    for (int i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
    D.counters = (void (*)(struct fakecuda_counters *))sym(driver, "fakecuda_get_counters");
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *s = argv[1];
    if (!strcmp(s, "lookups")) lookups();
    else if (!strcmp(s, "threads")) threads();
    else if (!strcmp(s, "runtime-threads")) runtime_threads();
    else CHECK(!"unknown scenario");
    struct fakecuda_counters c;
    D.counters(&c);
    printf("%s ok mallocs %llu\n", s, (unsigned long long)c.mallocs);
    return 0;
}
