/* SIMULATOR: a stand-in CUDA runtime (libcudart.so.12) for tests on machines without a GPU. It is
 * not NVIDIA's runtime and models only what the tests need: devices backed by host memory with a
 * fixed capacity (FAKECUDA_DEVICE_MEM bytes, FAKECUDA_DEVICES devices), a current device per
 * thread, a last error, pinned host memory, and "kernels" that are queued writes executed at
 * synchronization, so a pool that reuses a block before the work on it finished is caught. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInvalidDevice = 101 };
#define MAX_DEV 4
#define MAX_LIVE 4096
#define MAX_QUEUED 256

struct block { void *p; size_t n; int dev; int pinned; };
struct queued { unsigned char *p; size_t n; int value; };
struct fakecuda_counters { uint64_t mallocs, frees, syncs, host_allocs, host_frees; uint64_t used[MAX_DEV]; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct block live[MAX_LIVE];
static struct queued queue[MAX_QUEUED];
static int nqueued;
static struct fakecuda_counters counters;
static __thread int current;
static __thread int last_error;

static size_t capacity(void) {
    const char *v = getenv("FAKECUDA_DEVICE_MEM");
    return v ? strtoull(v, NULL, 10) : (1UL << 30);
}
static int devices(void) {
    const char *v = getenv("FAKECUDA_DEVICES");
    return v ? atoi(v) : 2;
}
static int fail(int e) { last_error = e; return e; }

static void run_queue(void) { /* caller holds lock */
    for (int i = 0; i < nqueued; i++) memset(queue[i].p, queue[i].value, queue[i].n);
    nqueued = 0;
}

int cudaGetDevice(int *d) { *d = current; return cudaSuccess; }
int cudaSetDevice(int d) {
    if (d < 0 || d >= devices()) return fail(cudaErrorInvalidDevice);
    current = d;
    return cudaSuccess;
}
int cudaGetLastError(void) { int e = last_error; last_error = 0; return e; }
int cudaPeekAtLastError(void) { return last_error; }

int cudaDeviceSynchronize(void) {
    pthread_mutex_lock(&lock);
    run_queue();
    counters.syncs++;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

static int alloc_block(void **ptr, size_t n, int pinned) {
    pthread_mutex_lock(&lock);
    if (!pinned && counters.used[current] + n > capacity()) {
        pthread_mutex_unlock(&lock);
        return fail(cudaErrorMemoryAllocation);
    }
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int slot = -1;
    for (int i = 0; i < MAX_LIVE; i++) if (!live[i].p) { slot = i; break; }
    if (p == MAP_FAILED || slot < 0) {
        pthread_mutex_unlock(&lock);
        return fail(cudaErrorMemoryAllocation);
    }
    live[slot] = (struct block){p, n ? n : 1, current, pinned};
    if (pinned) counters.host_allocs++;
    else { counters.used[current] += live[slot].n; counters.mallocs++; }
    *ptr = p;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

static int free_block(void *p, int pinned) {
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&lock);
    run_queue(); /* cudaFree and cudaFreeHost synchronize */
    counters.syncs++;
    for (int i = 0; i < MAX_LIVE; i++) {
        if (live[i].p == p && live[i].pinned == pinned) {
            if (pinned) counters.host_frees++;
            else { counters.used[live[i].dev] -= live[i].n; counters.frees++; }
            munmap(p, live[i].n);
            live[i].p = NULL;
            pthread_mutex_unlock(&lock);
            return cudaSuccess;
        }
    }
    pthread_mutex_unlock(&lock);
    return fail(cudaErrorInvalidValue);
}

int cudaMalloc(void **ptr, size_t n) { return alloc_block(ptr, n, 0); }
int cudaFree(void *p) { return free_block(p, 0); }
int cudaHostAlloc(void **ptr, size_t n, unsigned flags) { (void)flags; return alloc_block(ptr, n, 1); }
int cudaMallocHost(void **ptr, size_t n) { return alloc_block(ptr, n, 1); }
int cudaFreeHost(void *p) { return free_block(p, 1); }

int cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    pthread_mutex_lock(&lock);
    *total = capacity();
    *free_bytes = capacity() - counters.used[current];
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

/* Test hooks. */
void fakecuda_launch_memset(void *p, int value, size_t n) { /* a kernel on a non-blocking stream */
    pthread_mutex_lock(&lock);
    if (nqueued < MAX_QUEUED) queue[nqueued++] = (struct queued){p, n, value};
    pthread_mutex_unlock(&lock);
}
void fakecuda_get_counters(struct fakecuda_counters *out) {
    pthread_mutex_lock(&lock);
    *out = counters;
    pthread_mutex_unlock(&lock);
}
