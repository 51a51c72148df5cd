// tensormalloc.torch's allocation function, tm_cuda_alloc_torch_raising, called from C++ as
// PyTorch's pluggable allocator calls it, in a process with a C++ runtime but no libc10.so: a
// request the device cannot hold throws std::bad_alloc (PyTorch's c10::OutOfMemoryError is the
// real-PyTorch test's), which unwinds through the naked thrower to this catch with the caller's
// registers intact, and the next allocation works. Over the stand-in driver, under the preload.
// Prints "raises N", then one line per step.
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <new>

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            std::fprintf(stderr, "CHECK failed %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            std::exit(1);                                                             \
        }                                                                             \
    } while (0)

typedef void *(*alloc_fn)(long, int, void *);
typedef void (*free_fn)(void *, long, int, void *);

static alloc_fn alloc;

// Values the caller keeps in callee-saved registers across the throwing call (rbx, r12, r13 and
// the others the thrower saves and the unwinder must restore): read from a volatile, so the
// compiler can neither fold them nor reload them after the catch.
static volatile long seed = 1234567;

static __attribute__((noinline)) long survives() {
    long a = seed * 3, b = seed * 5, c = seed * 7, d = seed * 11, e = seed * 13, caught = 0;
    for (int i = 0; i < 3; i++) {
        try {
            void *p = alloc(1L << 40, 0, nullptr);
            std::printf("returned %p\n", p);
            std::exit(1);
        } catch (const std::bad_alloc &) {
            caught++;
        }
        long s = seed;
        CHECK(a == s * 3 && b == s * 5 && c == s * 7 && d == s * 11 && e == s * 13);
    }
    return caught;
}

int main() {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(cuda);
    auto init = (int (*)(unsigned))dlsym(cuda, "cuInit");
    auto retain = (int (*)(void **, int))dlsym(cuda, "cuDevicePrimaryCtxRetain");
    auto set_current = (int (*)(void *))dlsym(cuda, "cuCtxSetCurrent");
    void *ctx = nullptr;
    CHECK(init(0) == 0 && retain(&ctx, 0) == 0 && set_current(ctx) == 0);
    auto raises = (int (*)())dlsym(RTLD_DEFAULT, "tm_cuda_oom_raises");
    alloc = (alloc_fn)dlsym(RTLD_DEFAULT, "tm_cuda_alloc_torch_raising");
    auto release = (free_fn)dlsym(RTLD_DEFAULT, "tm_cuda_free");
    CHECK(raises && alloc && release);
    std::printf("raises %d\n", raises());
    std::printf("caught %ld\n", survives());
    void *p = alloc(1 << 20, 0, nullptr);
    CHECK(p);
    release(p, 1 << 20, 0, nullptr);
    std::printf("next allocation works\n");
    // Filling the device ends with the exception, each block real.
    void *held[4096];
    int n = 0;
    try {
        for (; n < 4096; n++) {
            held[n] = alloc(64 << 20, 0, nullptr);
            CHECK(held[n]);
        }
    } catch (const std::bad_alloc &) {
        std::printf("filled %d\n", n);
    }
    CHECK(n < 4096);
    for (int i = 0; i < n; i++) release(held[i], 64 << 20, 0, nullptr);
    CHECK((p = alloc(64 << 20, 0, nullptr)) != nullptr);
    release(p, 64 << 20, 0, nullptr);
    std::printf("after filling: works\n");
    // Zero bytes: null, no exception, as the pool answers.
    CHECK(alloc(0, 0, nullptr) == nullptr);
    return 0;
}
