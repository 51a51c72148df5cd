/* NVIDIA's libcudart.so.13 (the one in .venv-torch's nvidia wheels) over the stand-in driver
 * (c/fakecuda.c, a simulator): a library on the driver API retains a device's primary context and
 * makes it current (Numba, cuda-python, PyCUDA and JAX do); the program's first runtime call is
 * cudaMalloc (`device`) or cudaMallocHost (`pinned`); the library then releases its reference.
 * Alone, the runtime retained the context when that first call set it up, so the context and the
 * block live on. Before Note [The runtime set up before we serve it] the pool served the call
 * without the runtime ever setting up: the release destroyed the context with the block
 * (cudaMemset and cudaFree failing, the read 700; the pinned buffer's write SIGSEGV).
 * `reset`: as `device`, after a first cudaMalloc, a cudaDeviceReset and the library's retain
 * again: the primary context keeps its handle, and a per-thread record of the context the runtime
 * was set up for skipped the setting up (the review).
 * Prints "NAME ok". Declarations of our own: the wheel has no headers. */
#include <stdio.h>
#include <string.h>
#include "check.h"

typedef int CUdevice;
typedef void *CUcontext;
int cuInit(unsigned);
int cuDeviceGet(CUdevice *, int);
int cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
int cuDevicePrimaryCtxRelease_v2(CUdevice);
int cuDevicePrimaryCtxGetState(CUdevice, unsigned *, int *);
int cuCtxSetCurrent(CUcontext);
int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaMemset(void *, int, size_t);
int cudaDeviceSynchronize(void);
int cudaMallocHost(void **, size_t);
int cudaFreeHost(void *);
int cudaDeviceReset(void);
int fakecuda_read_byte(const void *, unsigned char *);

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "device";
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0) == 0 && cuDeviceGet(&dev, 0) == 0);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev) == 0 && cuCtxSetCurrent(ctx) == 0);
    if (!strcmp(mode, "reset")) {
        void *first = NULL;
        CHECK(cudaMalloc(&first, 1 << 20) == 0);
        CHECK(cudaDeviceReset() == 0);
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev) == 0 && cuCtxSetCurrent(ctx) == 0);
    }
    if (strcmp(mode, "pinned")) {
        void *block = NULL;
        CHECK(cudaMalloc(&block, 1 << 20) == 0);
        CHECK(cuDevicePrimaryCtxRelease_v2(dev) == 0);
        int rc = cudaMemset(block, 7, 1 << 20);
        if (rc) printf("cudaMemset after the library's release: %d\n", rc);
        CHECK(rc == 0);
        CHECK(cudaDeviceSynchronize() == 0);
        unsigned flags;
        int active = -1;
        CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active) == 0 && active == 1);
        unsigned char byte = 0;
        rc = fakecuda_read_byte(block, &byte);
        if (rc || byte != 7) printf("the block read %d, byte %d\n", rc, byte);
        CHECK(rc == 0 && byte == 7);
        CHECK(cudaFree(block) == 0);
    } else {
        char *pinned = NULL;
        CHECK(cudaMallocHost((void **)&pinned, 4 << 20) == 0);
        CHECK(cuDevicePrimaryCtxRelease_v2(dev) == 0);
        memset(pinned, 1, 4 << 20);
        CHECK(cudaFreeHost(pinned) == 0);
    }
    printf("%s ok\n", mode);
    return 0;
}
