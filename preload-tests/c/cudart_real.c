/* NVIDIA's libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel; test_cudart_real.py links
 * it) over the stand-in driver (c/fakecuda.c, a simulator). The runtime's first call makes its
 * lookups through cuGetProcAddress and stops at the private export tables the stand-in lacks.
 * Then each lookup it made is made again through the entry point the runtime used (dlsym of
 * cuGetProcAddress from the driver's handle, asked for cuGetProcAddress at 12000) and compared
 * with the driver's own answer. Prints "rc N" and one line per lookup:
 *   lookup NAME VERSION FLAGS RC driver|ours SYMBOL OBJECT */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "check.h"

int cudaGetDeviceCount(int *);
int fakecuda_get_proc_address(const char *, void **, int, unsigned long long);
int fakecuda_proc_log(int, const char **, int *, unsigned long long *);

typedef int (*get_proc_v1)(const char *, void **, int, unsigned long long);
typedef int (*get_proc_v2)(const char *, void **, int, unsigned long long, int *);

int main(void) {
    int n = 0;
    printf("rc %d\n", cudaGetDeviceCount(&n));
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
