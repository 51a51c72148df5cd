/* Forked children of a process whose threads use the pool (issue 27, item 2), over the
 * simulators (fakecudart.c over fakecuda.c, which answer a forked child as NVIDIA's driver does:
 * 3 to every call). Four threads allocate and free device and pinned blocks while the main
 * thread forks FORKS children; each child either makes no CUDA call (and exits through the exit
 * report under TENSORMALLOC_STATS) or frees the parent's blocks and allocates through every
 * entry point, and must get the driver's answers: never a hang (each child has 20 s), never a
 * block of the parent's handed out or freed. Usage: cuda_fork FORKS */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "standin.h"

typedef unsigned long long CUdeviceptr;
int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaMallocHost(void **, size_t);
int cudaFreeHost(void *);
int cudaGetLastError(void);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemFreeHost(void *);
int cuMemAllocHost_v2(void **, size_t);

enum { NOT_INITIALIZED = 3 };
static atomic_int stop;

static void *user(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    while (!atomic_load(&stop)) {
        void *d = NULL, *h = NULL;
        size_t n = ((rand_r(&seed) % 8) + 1) * MB;
        CHECK(cudaMalloc(&d, n) == 0);
        CHECK(cudaMallocHost(&h, n) == 0);
        memset(h, 1, n);
        CHECK(cudaFree(d) == 0 && cudaFreeHost(h) == 0);
    }
    return NULL;
}

/* What a child of a CUDA process gets from every entry point: the driver's 3. */
static int child(int i, void *dev, void *pinned) {
    alarm(20);
    if (i % 2 == 0) return 0; /* no CUDA call: exits through the exit hooks */
    void *p = NULL;
    CUdeviceptr d = 0;
    int rc[] = {cudaFree(dev), cuMemFree_v2((CUdeviceptr)(uintptr_t)dev), cudaFreeHost(pinned), cuMemFreeHost(pinned),
                cudaMalloc(&p, 4 * MB), cuMemAlloc_v2(&d, 4 * MB), cudaMallocHost(&p, 4 * MB), cuMemAllocHost_v2(&p, 4 * MB)};
    for (int k = 0; k < 8; k++)
        if (rc[k] != NOT_INITIALIZED) {
            fprintf(stderr, "child %d: call %d answered %d\n", i, k, rc[k]);
            return 2;
        }
    return 0;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 40;
    void *dev = NULL, *pinned = NULL;
    CHECK(cudaMalloc(&dev, 2 * MB) == 0 && cudaMallocHost(&pinned, 2 * MB) == 0);
    kernel_works(dev, 2 * MB, 0x77);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, user, (void *)(uintptr_t)(i + 1)) == 0);
    int bad = 0;
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) _exit(child(i, dev, pinned));
        int status;
        CHECK(waitpid(pid, &status, 0) == pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++) CHECK(pthread_join(t[i], NULL) == 0);
    kernel_works(dev, 2 * MB, 0x78); /* the parent's blocks are intact */
    CHECK(cudaFree(dev) == 0 && cudaFreeHost(pinned) == 0);
    printf("forks %d bad children %d\n", forks, bad);
    CHECK(bad == 0);
    printf("cuda fork ok\n");
    return 0;
}
