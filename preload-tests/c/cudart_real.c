/* NVIDIA's libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel; test_cudart_real.py links
 * it) over the stand-in driver (c/fakecuda.c, a simulator). The runtime's first call makes its
 * lookups through cuGetProcAddress and stops at the private export tables the stand-in lacks.
 * Then each lookup it made is made again through the entry point the runtime used (dlsym of
 * cuGetProcAddress from the driver's handle, asked for cuGetProcAddress at 12000) and compared
 * with the driver's own answer. Prints "rc N" and one line per lookup:
 *   lookup NAME VERSION FLAGS RC driver|ours SYMBOL OBJECT
 * With argv[1] "threads", 16 threads make the process's first calls at once: half the runtime's
 * (its lookups run while the driver is being bound), half the driver's cuMemAlloc_v2 by symbol
 * (no context: 201); each side prints its one answer, or "mixed". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "check.h"

int cudaGetDeviceCount(int *);
int cuInit(unsigned);
int cuMemAlloc_v2(unsigned long long *, size_t);
int fakecuda_get_proc_address(const char *, void **, int, unsigned long long);
int fakecuda_proc_log(int, const char **, int *, unsigned long long *);

typedef int (*get_proc_v1)(const char *, void **, int, unsigned long long);
typedef int (*get_proc_v2)(const char *, void **, int, unsigned long long, int *);

#define THREADS 16
static pthread_barrier_t start;
static int answers[THREADS];

static void *first_call(void *arg) {
    int i = (int)(intptr_t)arg, n = 0;
    unsigned long long p = 0;
    pthread_barrier_wait(&start);
    answers[i] = i % 2 ? cudaGetDeviceCount(&n) : (cuInit(0), cuMemAlloc_v2(&p, 1 << 20));
    return NULL;
}

/* The one answer every thread of a side got, or -1000 when they differ. */
static int side(int odd) {
    int a = answers[odd];
    for (int i = odd; i < THREADS; i += 2)
        if (answers[i] != a) return -1000;
    return a;
}

int main(int argc, char **argv) {
    int n = 0;
    if (argc > 1 && !strcmp(argv[1], "threads")) {
        pthread_t t[THREADS];
        pthread_barrier_init(&start, NULL, THREADS);
        for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, first_call, (void *)(intptr_t)i) == 0);
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
        printf("rc %d\ndriver rc %d\n", side(1), side(0));
    } else {
        printf("rc %d\n", cudaGetDeviceCount(&n));
    }
    const char *name = NULL;
    int version = 0;
    unsigned long long flags = 0;
    int count = fakecuda_proc_log(0, &name, &version, &flags);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib);
    get_proc_v1 get_v1 = (get_proc_v1)dlsym(lib, "cuGetProcAddress");
    CHECK(get_v1);
    void *v2 = NULL;
    CHECK(get_v1("cuGetProcAddress", &v2, 12000, 0) == 0 && v2);
    get_proc_v2 get = (get_proc_v2)v2;
    for (int i = 0; i < count; i++) {
        char copy[64];
        CHECK(fakecuda_proc_log(i, &name, &version, &flags) >= count);
        snprintf(copy, sizeof copy, "%s", name);
        void *got = NULL, *own = NULL;
        int status = 0;
        int rc = get(copy, &got, version, flags, &status);
        int own_rc = fakecuda_get_proc_address(copy, &own, version, flags);
        CHECK(rc == own_rc);
        Dl_info info;
        const char *sym = "-", *obj = "-";
        if (got && got != own && dladdr(got, &info)) {
            sym = info.dli_sname ? info.dli_sname : "?";
            obj = info.dli_fname ? info.dli_fname : "?";
        }
        printf("lookup %s %d %llu %d %s %s %s\n", copy[0] ? copy : "(empty)", version, flags, rc, got == own ? "driver" : "ours", sym, obj);
    }
    return 0;
}
