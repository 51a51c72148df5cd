/* tm_cuda_alloc_torch_raising in a C process (no C++ runtime to throw with): a request the device
 * cannot hold returns NULL, as tm_cuda_alloc_torch does, with one stderr line saying why; the next
 * allocation works. Over the stand-in driver, under the preload. */
#include "check.h"

int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(cuda);
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
    int (*retain)(void **, int) = (int (*)(void **, int))dlsym(cuda, "cuDevicePrimaryCtxRetain");
    int (*set_current)(void *) = (int (*)(void *))dlsym(cuda, "cuCtxSetCurrent");
    void *ctx = NULL;
    CHECK(init(0) == 0 && retain(&ctx, 0) == 0 && set_current(ctx) == 0);
    int (*raises)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "tm_cuda_oom_raises");
    void *(*alloc)(long, int, void *) = (void *(*)(long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_alloc_torch_raising");
    void (*release)(void *, long, int, void *) = (void (*)(void *, long, int, void *))dlsym(RTLD_DEFAULT, "tm_cuda_free");
    CHECK(raises && alloc && release);
    printf("raises %d\n", raises());
    CHECK(alloc(1L << 40, 0, NULL) == NULL);
    CHECK(alloc(1L << 40, 0, NULL) == NULL);
    void *p = alloc(1 << 20, 0, NULL);
    CHECK(p != NULL);
    release(p, 1 << 20, 0, NULL);
    printf("null, then the next allocation works\n");
    return 0;
}
