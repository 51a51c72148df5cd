/* Issue 36, item 3: CUDA IPC of pooled blocks between two processes over the stand-in driver and
 * runtime (c/fakecuda.c, c/fakecudart.c: simulators), in classic and expandable segments.
 * argv[1] is the role, argv[2] the API the handles go through ("runtime": cudaIpc*, "driver":
 * cuIpc*), argv[3] (receive only) "hold".
 *   send     allocates two blocks of each size in TM_TEST_SIZES (KiB, comma-separated; blocks of
 *            one size side by side, so small ones share segments), fills each with its own byte
 *            (a stand-in kernel), exports each and prints "block I SIZE VALUE HEX" (HEX: the
 *            handle; "refused RC" when the export was refused), then "ready"; then obeys stdin:
 *            "check" prints "written I yes|no" (whether the receiver's write of VALUE^0x5a reached
 *            the block's last byte), "free I" frees block I and fills a new block of its size
 *            with 0xee ("freed"), "trim" gives the cache back (tm_trim: "trimmed"), "drain" frees
 *            every block and trims ("drained USED FDS": the device memory still in use, and the
 *            descriptors open beyond those before the first allocation), "exit" ends.
 *   hold     as send, without exporting anything ("block I SIZE VALUE -" lines).
 *   receive  reads "block ..." lines until "end"; for each, opens the handle and prints
 *            "open I ok" (the block's first, middle and last bytes hold VALUE), "open I wrong"
 *            (they do not: other memory) or "open I rc RC" (refused); on an open block it
 *            writes VALUE^0x5a at the last byte. With "hold" it then prints "opened" and waits for
 *            a line, and prints "still I yes|no" (whether the first and middle bytes still hold
 *            VALUE, whatever the sender did meanwhile). Then it closes each ("close I rc RC"), and
 *            prints "gone I yes|no" (whether the driver knows the pointer no more).
 *   siblings forks two children before any CUDA call of its own (as torch.multiprocessing's fork
 *            workers are made); each exports one 4 KiB block holding its own byte (0xaa, 0xbb)
 *            and waits; the parent opens the first's handle, keeps it open, opens the second's,
 *            and prints "sibling I RC VALUE" for each (VALUE: the first byte read there, -1 when
 *            refused). Two such children have one history: same addresses, same buffer ids.
 * With TM_TEST_ALARM_MS set, the receiver takes SIGALRM (a handler, SA_RESTART) every that many
 * milliseconds throughout, as gperftools' real-time profiler does. */
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "standin.h"

typedef struct { char reserved[64]; } CUipcMemHandle;
typedef unsigned long long CUdeviceptr;
int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaSetDevice(int);
int cudaGetLastError(void);
int cudaIpcGetMemHandle(CUipcMemHandle *, void *);
int cudaIpcOpenMemHandle(void **, CUipcMemHandle, unsigned);
int cudaIpcCloseMemHandle(void *);
int cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
int cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned);
int cuIpcCloseMemHandle(CUdeviceptr);
int cuPointerGetAttribute(void *, int, CUdeviceptr);
int cudaMemGetInfo(size_t *, size_t *);

/* Descriptors open in this process, but for files under /proc and /sys: the allocator's thread
 * reads a few of those now and then (docs/system-calls.md), and one open at the moment of the
 * count is no descriptor an export left behind (this directory's own is one of them too). */
static int open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    CHECK(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char target[256];
        ssize_t len = readlinkat(dirfd(d), e->d_name, target, sizeof target - 1);
        if (len < 0) continue; /* "." and "..", or a descriptor closed meanwhile */
        target[len] = 0;
        if (strncmp(target, "/proc/", 6) && strncmp(target, "/sys/", 5)) n++;
    }
    closedir(d);
    return n;
}

static int by_driver;

static void to_hex(const CUipcMemHandle *h, char *out) {
    for (int i = 0; i < 64; i++) sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static void from_hex(const char *s, CUipcMemHandle *h) {
    CHECK(strlen(s) >= 128);
    for (int i = 0; i < 64; i++) {
        unsigned v;
        CHECK(sscanf(s + 2 * i, "%2x", &v) == 1);
        h->reserved[i] = (char)v;
    }
}

#define MAX_BLOCKS 64
static void *blocks[MAX_BLOCKS];
static size_t sizes[MAX_BLOCKS];
static int values[MAX_BLOCKS];

static void send(int exporting) {
    int fds_before = open_fds();
    void *fresh_blocks[MAX_BLOCKS];
    int nfresh = 0;
    size_t (*trim)(void) = (size_t (*)(void))dlsym(RTLD_DEFAULT, "tm_trim");
    const char *list = getenv("TM_TEST_SIZES");
    CHECK(list);
    char copy[512];
    snprintf(copy, sizeof copy, "%s", list);
    int n = 0;
    for (char *tok = strtok(copy, ","); tok && n + 2 <= MAX_BLOCKS; tok = strtok(NULL, ",")) {
        size_t size = strtoull(tok, NULL, 10) * 1024;
        for (int k = 0; k < 2; k++, n++) {
            CHECK(cudaMalloc(&blocks[n], size) == 0);
            sizes[n] = size;
            values[n] = 0x10 + n;
            CHECK(fakecuda_launch_memset(blocks[n], values[n], size) == 0);
        }
    }
    CHECK(cudaDeviceSynchronize() == 0);
    for (int i = 0; i < n && !exporting; i++) printf("block %d %zu %d -\n", i, sizes[i], values[i]);
    for (int i = 0; i < n && exporting; i++) {
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        int rc = by_driver ? cuIpcGetMemHandle(&h, (CUdeviceptr)(uintptr_t)blocks[i]) : cudaIpcGetMemHandle(&h, blocks[i]);
        if (rc) {
            cudaGetLastError();
            printf("refused %d\n", rc);
            continue;
        }
        char hex[129];
        to_hex(&h, hex);
        printf("block %d %zu %d %s\n", i, sizes[i], values[i], hex);
    }
    printf("ready\n");
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        int i;
        if (!strncmp(line, "check", 5)) {
            for (int k = 0; k < n; k++) printf("written %d %s\n", k, blocks[k] && byte_at((char *)blocks[k] + sizes[k] - 1) == (values[k] ^ 0x5a) ? "yes" : "no");
        } else if (sscanf(line, "free %d", &i) == 1 && i >= 0 && i < n && blocks[i]) {
            CHECK(cudaFree(blocks[i]) == 0);
            blocks[i] = NULL;
            void *fresh = NULL;
            CHECK(cudaMalloc(&fresh, sizes[i]) == 0 && nfresh < MAX_BLOCKS);
            kernel_works(fresh, sizes[i], 0xee);
            fresh_blocks[nfresh++] = fresh;
            printf("freed\n");
        } else if (!strncmp(line, "trim", 4)) {
            if (trim) trim();
            printf("trimmed\n");
        } else if (!strncmp(line, "drain", 5)) {
            for (int k = 0; k < n; k++) {
                if (blocks[k]) CHECK(cudaFree(blocks[k]) == 0);
                blocks[k] = NULL;
            }
            for (int k = 0; k < nfresh; k++) CHECK(cudaFree(fresh_blocks[k]) == 0);
            nfresh = 0;
            if (trim) trim();
            size_t free_b = 0, total = 0;
            CHECK(cudaMemGetInfo(&free_b, &total) == 0);
            printf("drained %zu %d\n", total - free_b, open_fds() - fds_before);
        } else if (!strncmp(line, "exit", 4)) {
            break;
        }
        fflush(stdout);
    }
}

static volatile sig_atomic_t alarms;
static void on_alarm(int sig) {
    (void)sig;
    alarms++;
}

static void alarm_every(const char *ms) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    long us = atol(ms) * 1000;
    struct itimerval every = {{us / 1000000, us % 1000000}, {us / 1000000, us % 1000000}};
    CHECK(us > 0 && setitimer(ITIMER_REAL, &every, NULL) == 0);
}

static void receive(int hold) {
    CHECK(cudaSetDevice(0) == 0);
    if (getenv("TM_TEST_ALARM_MS")) alarm_every(getenv("TM_TEST_ALARM_MS"));
    char line[512];
    void *opened[MAX_BLOCKS] = {0};
    size_t opened_sizes[MAX_BLOCKS];
    int ids[MAX_BLOCKS], opened_values[MAX_BLOCKS], n = 0;
    while (fgets(line, sizeof line, stdin) && strncmp(line, "end", 3) && n < MAX_BLOCKS) {
        int i, value;
        size_t size;
        char hex[160];
        if (sscanf(line, "block %d %zu %d %159s", &i, &size, &value, hex) != 4) continue;
        CUipcMemHandle h;
        from_hex(hex, &h);
        void *p = NULL;
        int rc;
        if (by_driver) {
            CUdeviceptr d = 0;
            rc = cuIpcOpenMemHandle_v2(&d, h, 1);
            p = (void *)(uintptr_t)d;
        } else {
            rc = cudaIpcOpenMemHandle(&p, h, 1);
        }
        if (rc) {
            cudaGetLastError();
            printf("open %d rc %d\n", i, rc);
            continue;
        }
        int right = holds(p, size, value);
        printf("open %d %s\n", i, right ? "ok" : "wrong");
        if (right) {
            CHECK(fakecuda_launch_memset((char *)p + size - 1, value ^ 0x5a, 1) == 0);
            CHECK(cudaDeviceSynchronize() == 0);
        }
        opened_sizes[n] = size, opened_values[n] = value;
        opened[n] = p, ids[n++] = i;
    }
    if (hold) {
        printf("opened\n");
        fflush(stdout);
        CHECK(fgets(line, sizeof line, stdin));
        for (int k = 0; k < n; k++) {
            int still = byte_at(opened[k]) == opened_values[k] && byte_at((char *)opened[k] + opened_sizes[k] / 2) == opened_values[k];
            printf("still %d %s\n", ids[k], still ? "yes" : "no");
        }
    }
    /* Closed once all are open: blocks of one segment share its mapping meanwhile. */
    for (int k = 0; k < n; k++) {
        int rc = by_driver ? cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)opened[k]) : cudaIpcCloseMemHandle(opened[k]);
        printf("close %d rc %d\n", ids[k], rc);
    }
    for (int k = 0; k < n; k++) {
        int type = 0;
        int known = cuPointerGetAttribute(&type, 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */, (CUdeviceptr)(uintptr_t)opened[k]) == 0;
        printf("gone %d %s\n", ids[k], known ? "no" : "yes");
    }
}

/* A forked sibling's export: one 4 KiB block holding `value`, its handle written to `out`; waits
 * until `hold` closes. */
static void sibling(int value, int out, int hold) {
    void *b = NULL;
    CHECK(cudaSetDevice(0) == 0 && cudaMalloc(&b, 4096) == 0);
    kernel_works(b, 4096, value);
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    CHECK((by_driver ? cuIpcGetMemHandle(&h, (CUdeviceptr)(uintptr_t)b) : cudaIpcGetMemHandle(&h, b)) == 0);
    CHECK(write(out, &h, sizeof h) == sizeof h);
    char c;
    CHECK(read(hold, &c, 1) == 0);
    _exit(0);
}

static void siblings(void) {
    int handles[2][2], hold[2];
    CHECK(pipe(hold) == 0);
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        CHECK(pipe(handles[i]) == 0);
        kids[i] = fork();
        CHECK(kids[i] >= 0);
        if (kids[i] == 0) {
            close(hold[1]);
            sibling(i ? 0xbb : 0xaa, handles[i][1], hold[0]);
        }
    }
    close(hold[0]);
    CUipcMemHandle h[2];
    for (int i = 0; i < 2; i++) CHECK(read(handles[i][0], &h[i], sizeof h[i]) == sizeof h[i]);
    CHECK(cudaSetDevice(0) == 0);
    void *p[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        int rc;
        if (by_driver) {
            CUdeviceptr d = 0;
            rc = cuIpcOpenMemHandle_v2(&d, h[i], 1);
            p[i] = (void *)(uintptr_t)d;
        } else {
            rc = cudaIpcOpenMemHandle(&p[i], h[i], 1);
        }
        printf("sibling %d %d %d\n", i, rc, rc ? -1 : byte_at(p[i]));
    }
    for (int i = 0; i < 2; i++) {
        if (p[i]) CHECK((by_driver ? cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)p[i]) : cudaIpcCloseMemHandle(p[i])) == 0);
    }
    close(hold[1]);
    for (int i = 0; i < 2; i++) {
        int status = 0;
        CHECK(waitpid(kids[i], &status, 0) == kids[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 3 || argc == 4);
    by_driver = !strcmp(argv[2], "driver");
    if (!strcmp(argv[1], "siblings")) siblings(); /* before any CUDA call of the parent's */
    else if (cudaSetDevice(0) != 0) CHECK(!"cudaSetDevice");
    else if (!strcmp(argv[1], "send")) send(1);
    else if (!strcmp(argv[1], "hold")) send(0);
    else if (!strcmp(argv[1], "receive")) receive(argc == 4 && !strcmp(argv[3], "hold"));
    else CHECK(!"unknown role");
    printf("%s done\n", argv[1]);
    return 0;
}
