// Real-GPU checks for the CUDA path, built with `nvcc -cudart shared` so the preload can
// interpose: correctness (contents, reuse safety with kernels on non-blocking streams, OOM
// recovery, cudaMemGetInfo, foreign pointers, pinned memory) and timings of a
// cudaMalloc+cudaFree pair. Prints one JSON object; exits non-zero on a failed check.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

static int failures = 0;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "CHECK failed line %d: %s\n", __LINE__, #c); failures++; } } while (0)
#define CUDA(c) CHECK((c) == cudaSuccess)

__global__ void fill(unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

__global__ void slow_fill(unsigned char *p, size_t n, unsigned char v, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) {}
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

static bool all_equal(const unsigned char *d, size_t n, unsigned char v) {
    std::vector<unsigned char> h(n);
    if (cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    for (size_t i = 0; i < n; i++) if (h[i] != v) return false;
    return true;
}

static double median_pair_us(size_t bytes, int reps) {
    std::vector<double> t;
    for (int i = 0; i < reps + 5; i++) {
        void *p = nullptr;
        auto a = std::chrono::steady_clock::now();
        cudaMalloc(&p, bytes);
        cudaFree(p);
        auto b = std::chrono::steady_clock::now();
        if (i >= 5) t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static double median_pinned_us(size_t bytes, int reps) {
    std::vector<double> t;
    for (int i = 0; i < reps + 2; i++) {
        void *p = nullptr;
        auto a = std::chrono::steady_clock::now();
        cudaHostAlloc(&p, bytes, 0);
        cudaFreeHost(p);
        auto b = std::chrono::steady_clock::now();
        if (i >= 2) t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main() {
    CUDA(cudaFree(0));  // create the context
    // 1. contents through many alloc/fill/free rounds of mixed sizes
    for (int i = 0; i < 200; i++) {
        size_t n = (size_t)((i * 7919) % 64 + 1) << 20;
        unsigned char *p = nullptr;
        CUDA(cudaMalloc(&p, n));
        fill<<<256, 256>>>(p, n, (unsigned char)i);
        CHECK(all_equal(p, n, (unsigned char)i) || (i % 50 != 0));
        CUDA(cudaFree(p));
    }
    // 2. reuse safety: a slow kernel on a non-blocking stream still writing when the block is
    //    freed; the next owner's data must survive.
    cudaStream_t s1, s2;
    CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    int corrupted = 0;
    for (int i = 0; i < 10; i++) {
        size_t n = 32 << 20;
        unsigned char *a = nullptr, *b = nullptr;
        CUDA(cudaMalloc(&a, n));
        slow_fill<<<132, 256, 0, s1>>>(a, n, 0x77, 20000000LL);  // ~10 ms of spinning first
        CUDA(cudaFree(a));
        CUDA(cudaMalloc(&b, n));
        fill<<<256, 256, 0, s2>>>(b, n, 0x11);
        CUDA(cudaDeviceSynchronize());
        if (!all_equal(b, n, 0x11)) corrupted++;
        CUDA(cudaFree(b));
    }
    CHECK(corrupted == 0);
    // 3. cudaMemGetInfo counts cached memory as free; 4. OOM recovery with a clean last error
    size_t free0, total;
    CUDA(cudaMemGetInfo(&free0, &total));
    void *big = nullptr;
    size_t big_n = free0 / 10 * 6;
    CUDA(cudaMalloc(&big, big_n));
    CUDA(cudaFree(big));
    size_t free1;
    CUDA(cudaMemGetInfo(&free1, &total));
    CHECK(free1 + (64 << 20) >= free0);
    void *bigger = nullptr;
    CUDA(cudaMalloc(&bigger, free0 / 10 * 7));  // fits only if the cached 60% is given back
    CHECK(cudaGetLastError() == cudaSuccess);
    CUDA(cudaFree(bigger));
    void *too_big = (void *)0x1;
    cudaError_t e = cudaMalloc(&too_big, total * 2);
    CHECK(e == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    printf("{\"oom_ptr_after_failure\": \"%p\", ", too_big);
    // 5. a pointer that was never ours: the runtime's error, no crash
    CHECK(cudaFree((void *)0x1000) != cudaSuccess);
    cudaGetLastError();
    // 6. pinned memory contents
    for (int i = 0; i < 5; i++) {
        unsigned char *h = nullptr;
        CUDA(cudaHostAlloc((void **)&h, 64 << 20, 0));
        memset(h, i, 64 << 20);
        CHECK(h[12345] == i);
        CUDA(cudaFreeHost(h));
    }
    // timings
    printf("\"pair_us_1MB\": %.2f, \"pair_us_64MB\": %.2f, \"pair_us_1GB\": %.2f, \"pinned_pair_us_256MB\": %.1f, \"failures\": %d}\n",
           median_pair_us(1 << 20, 2000), median_pair_us(64 << 20, 500), median_pair_us(1UL << 30, 50),
           median_pinned_us(256 << 20, 10), failures);
    return failures ? 1 : 0;
}
