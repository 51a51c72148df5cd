/* What a malloc may do (issue 34): one program, several scenarios, each run by test_footprint.py
 * under tensormalloc and under glibc alone.
 *   footprint work              large blocks every way a program uses them (malloc, calloc dense
 *                               and sparse, realloc, aligned, blocks the program mprotects,
 *                               advises, locks or tags with key -1, threads, a fork): the system
 *                               calls the library makes beside it are what the seccomp tests filter
 *   footprint limit HOW MS [RES [small]]
 *                               frees 1 GiB, has RLIMIT_AS (RES as, the default) or RLIMIT_DATA
 *                               (data) lowered to 1 GiB (HOW: setrlimit, raw:
 *                               syscall(SYS_prlimit64), other: by the test's process, which it
 *                               waits for on stdin), waits MS ms, then maps 512 MiB and starts a
 *                               thread; with `small`, makes 600 MiB of 1000-byte mallocs instead
 *                               (glibc's heap, grown by brk) and prints how many succeeded
 *   footprint limit-race N      N times: frees 1 GiB, lowers RLIMIT_AS to 1 GiB with a raw
 *                               prlimit64 (unseen by the library), and maps 512 MiB while another
 *                               thread sets the same limit through libc (which the library follows
 *                               by emptying its cache), then lifts the limit through libc (the
 *                               cache may hold 1 GiB again): prints how many mappings failed
 *   footprint mlockall MS       frees 256 MiB, mlockall(MCL_CURRENT|MCL_FUTURE), waits MS ms and
 *                               prints VmLck; a 64 MiB block then, VmLck again, and after its free
 *   footprint hugepage          blocks advised MADV_NOHUGEPAGE or MADV_HUGEPAGE, freed, and the
 *                               next block's VmFlags in smaps (hg, nh)
 *   footprint spy               100 page calls the program makes; a spy library preloaded after
 *                               the allocator counts them (spy_count)
 *   footprint reload N          dlopen, use and dlclose a plugin N times, then load another
 *                               library that keeps a block: the holders table must name it */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

#define MIB ((size_t)1 << 20)

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

static void *churn(void *arg) {
    for (int i = 0; i < 200; i++) {
        size_t n = (4 + (size_t)(i % 5) * 4) * MIB;
        char *p = malloc(n);
        CHECK(p != NULL);
        p[0] = p[n - 1] = (char)i;
        free(p);
    }
    return arg;
}

static int work(void) {
    /* Reuse: malloc, calloc used densely and sparsely (the zeroing policy's paths). */
    for (int round = 0; round < 6; round++) {
        char *p = malloc(64 * MIB);
        CHECK(p != NULL);
        memset(p, 1, 64 * MIB);
        free(p);
        uint64_t *z = calloc(8 * MIB, 8);
        CHECK(z != NULL && z[0] == 0 && z[4 * MIB] == 0 && z[8 * MIB - 1] == 0);
        for (size_t i = 0; i < 8 * MIB; i++) z[i] = i;
        free(z);
        char *s = calloc(1, 32 * MIB);
        CHECK(s != NULL && s[0] == 0 && s[16 * MIB] == 0);
        s[0] = s[16 * MIB] = 1;
        free(s);
    }
    /* realloc grow and shrink; aligned. */
    char *r = malloc(8 * MIB);
    memset(r, 2, 8 * MIB);
    r = realloc(r, 40 * MIB);
    CHECK(r != NULL && r[8 * MIB - 1] == 2);
    r = realloc(r, 20 * MIB);
    CHECK(r != NULL && r[0] == 2);
    free(r);
    void *a = NULL;
    CHECK(posix_memalign(&a, 4 * MIB, 12 * MIB) == 0 && (uintptr_t)a % (4 * MIB) == 0);
    free(a);
    /* Blocks whose pages the program changes: reset at free, plain for the next owner. */
    for (int round = 0; round < 3; round++) {
        char *b = malloc(16 * MIB);
        CHECK(b != NULL);
        char *page = (char *)(((uintptr_t)b + 4095) & ~(uintptr_t)4095); /* glibc's blocks start past a header */
        CHECK(mprotect(page, 4096, PROT_READ) == 0);
        CHECK(madvise(page + 4096, 4096, MADV_DONTDUMP) == 0);
        CHECK(pkey_mprotect(page + 8192, 4096, PROT_READ, -1) == 0);
        CHECK(madvise(page + 4 * 4096, 8 * MIB, MADV_DONTNEED) == 0);
        if (mlock(page + 3 * 4096, 4096) != 0) CHECK(errno == EPERM || errno == ENOMEM || errno == EAGAIN);
        /* A program gives glibc's heap its pages back as it got them: so does this one (tensormalloc
         * resets the rest itself: Note [Plain memory]). */
        CHECK(mprotect(page, 3 * 4096, PROT_READ | PROT_WRITE) == 0);
        free(b);
        char *c = malloc(16 * MIB);
        CHECK(c != NULL);
        memset(c, 3, 16 * MIB);
        free(c);
    }
    /* Threads, and a child that allocates on its own. */
    pthread_t t[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, churn, NULL) == 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        char *c = malloc(32 * MIB);
        if (!c) _exit(1);
        memset(c, 4, 32 * MIB);
        free(c);
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("footprint work ok\n");
    return 0;
}

static void *idle(void *arg) { return arg; }

static int limit(const char *how, long ms, const char *res, int small) {
    int resource = strcmp(res, "data") == 0 ? RLIMIT_DATA : RLIMIT_AS;
    char *big = malloc(1024 * MIB);
    CHECK(big != NULL);
    big[0] = 1;
    free(big);
    struct rlimit rl = {1024 * MIB, 1024 * MIB};
    if (strcmp(how, "setrlimit") == 0) {
        CHECK(setrlimit(resource, &rl) == 0);
    } else if (strcmp(how, "raw") == 0) {
        CHECK(syscall(SYS_prlimit64, 0, resource, &rl, NULL) == 0);
    } else {
        /* The test's process sets it with prlimit(2), then answers. */
        printf("ready\n");
        fflush(stdout);
        char line[16];
        CHECK(fgets(line, sizeof line, stdin) != NULL);
    }
    sleep_ms(ms);
    if (small) {
        /* 600 MiB in pieces under the 128 KiB threshold: the next allocator's, from brk. */
        enum { PIECES = 600 * 1024 };
        static void *piece[PIECES];
        small_blocks(piece, PIECES);
        return 0;
    }
    void *m = mmap(NULL, 512 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("mmap 512 MiB: %s\n", m == MAP_FAILED ? strerror(errno) : "ok");
    if (m != MAP_FAILED) munmap(m, 512 * MIB);
    pthread_t t;
    int rc = pthread_create(&t, NULL, idle, NULL);
    printf("pthread_create: %s\n", rc ? strerror(rc) : "ok");
    if (rc == 0) pthread_join(t, NULL);
    return 0;
}

static atomic_int race_go;

/* Tells the library (through libc's setrlimit) of the limit the main thread set unseen. */
static void *race_limit(void *arg) {
    struct rlimit *rl = arg;
    while (!atomic_load(&race_go)) {}
    setrlimit(RLIMIT_AS, rl);
    return NULL;
}

static int soft_address_limit(rlim_t bytes) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0) return -1;
    rl.rlim_cur = bytes;
    return (int)syscall(SYS_prlimit64, 0, RLIMIT_AS, &rl, NULL);
}

/* The cache emptied by one thread while another's mapping fails for want of room: the retry must
 * come once the emptying thread's unmap is done (Note [Room for others], rule 6). */
static int limit_race(long rounds) {
    long failed = 0;
    struct rlimit lifted;
    CHECK(getrlimit(RLIMIT_AS, &lifted) == 0);
    for (long i = 0; i < rounds; i++) {
        char *big = malloc(1024 * MIB);
        CHECK(big != NULL);
        big[0] = 1;
        free(big);
        atomic_store(&race_go, 0);
        pthread_t t;
        struct rlimit rl;
        CHECK(getrlimit(RLIMIT_AS, &rl) == 0);
        rl.rlim_cur = 1024 * MIB;
        CHECK(pthread_create(&t, NULL, race_limit, &rl) == 0);
        CHECK(soft_address_limit(1024 * MIB) == 0);
        atomic_store(&race_go, 1);
        void *m = mmap(NULL, 512 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) failed++;
        else munmap(m, 512 * MIB);
        pthread_join(t, NULL);
        CHECK(setrlimit(RLIMIT_AS, &lifted) == 0);
    }
    printf("mmap failed %ld of %ld\n", failed, rounds);
    return 0;
}

static long vmlck_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static int lockall(long ms) {
    for (int i = 0; i < 4; i++) {
        char *p = malloc(64 * MIB + (size_t)i * 4096);
        CHECK(p != NULL);
        memset(p, 1, 64 * MIB);
        free(p);
    }
    int rc = mlockall(MCL_CURRENT | MCL_FUTURE);
    printf("mlockall: %s\n", rc ? strerror(errno) : "ok");
    sleep_ms(ms);
    printf("VmLck after mlockall: %ld kB\n", vmlck_kb());
    char *b = malloc(64 * MIB);
    CHECK(b != NULL);
    b[0] = 1;
    printf("VmLck with a 64 MiB block: %ld kB\n", vmlck_kb());
    free(b);
    printf("VmLck after its free: %ld kB\n", vmlck_kb());
    munlockall();
    return 0;
}

/* The VmFlags line of the mapping holding p ("hg", "nh" or neither), from /proc/self/smaps. */
static void flags_of(void *p, char *out, size_t n) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int inside = 0;
    snprintf(out, n, "?");
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(out, n, "%s%s", strstr(line, " hg") ? "hg" : "", strstr(line, " nh") ? "nh" : "");
            if (!out[0]) snprintf(out, n, "none");
            break;
        }
    }
    if (f) fclose(f);
}

static int hugepage(void) {
    char flags[16];
    void *(*other_malloc)(size_t) = NULL;
    void *lib = dlopen(getenv("FOOTPRINT_OTHER"), RTLD_NOW);
    if (lib) other_malloc = (void *(*)(size_t))dlsym(lib, "other_malloc");
    CHECK(other_malloc != NULL);
    /* MADV_NOHUGEPAGE: the next block, whoever asks, has neither flag. */
    char *p = malloc(16 * MIB);
    CHECK(p != NULL);
    memset(p, 1, 16 * MIB);
    char *page = (char *)(((uintptr_t)p + 4095) & ~(uintptr_t)4095);
    CHECK(madvise(page, 8 * MIB, MADV_NOHUGEPAGE) == 0);
    flags_of(p + 4 * MIB, flags, sizeof flags);
    printf("advised: %s\n", flags);
    free(p);
    char *q = malloc(16 * MIB);
    CHECK(q != NULL);
    q[0] = 1;
    flags_of(q + 4 * MIB, flags, sizeof flags);
    printf("after MADV_NOHUGEPAGE, next block: %s\n", flags);
    free(q);
    /* MADV_HUGEPAGE: another library's next block has neither flag. */
    p = malloc(16 * MIB);
    CHECK(p != NULL);
    memset(p, 1, 16 * MIB);
    page = (char *)(((uintptr_t)p + 4095) & ~(uintptr_t)4095);
    CHECK(madvise(page, 8 * MIB, MADV_HUGEPAGE) == 0);
    free(p);
    q = other_malloc(16 * MIB);
    CHECK(q != NULL);
    q[0] = 1;
    flags_of(q + 4 * MIB, flags, sizeof flags);
    printf("after MADV_HUGEPAGE, another library's block: %s\n", flags);
    free(q);
    return 0;
}

static int spy(void) {
    void (*reset)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "spy_reset");
    long (*count)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "spy_count");
    CHECK(reset != NULL && count != NULL);
    char *b = malloc(16 * MIB); /* one of ours: its page calls count too */
    CHECK(b != NULL);
    reset();
    int calls = 0;
    for (int i = 0; i < 10; i++) {
        char *m = mmap(NULL, 8 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(m != MAP_FAILED);
        CHECK(madvise(m, 8 * 4096, MADV_DONTNEED) == 0);
        char *n = mremap(m, 8 * 4096, 16 * 4096, MREMAP_MAYMOVE);
        CHECK(n != MAP_FAILED);
        CHECK(mprotect(n, 4096, PROT_READ) == 0);
        mlock(n + 4096, 4096);
        munlock(n + 4096, 4096);
        CHECK(pkey_mprotect(n, 4096, PROT_READ | PROT_WRITE, -1) == 0);
        CHECK(munmap(n, 16 * 4096) == 0);
        char *page = (char *)(((uintptr_t)b + 4095) & ~(uintptr_t)4095);
        CHECK(mprotect(page + 4096, 4096, PROT_READ) == 0);
        CHECK(madvise(page + 8192, 8 * MIB, MADV_DONTNEED) == 0);
        calls += 10;
    }
    printf("spy saw %ld of %d\n", count(), calls);
    free(b);
    return 0;
}

static int reload(long n) {
    const char *plugin = getenv("FOOTPRINT_PLUGIN"), *final = getenv("FOOTPRINT_FINAL");
    CHECK(plugin && final);
    for (long i = 0; i < n; i++) {
        void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
        CHECK(h != NULL);
        void (*run)(void) = (void (*)(void))dlsym(h, "plugin_run");
        CHECK(run != NULL);
        run();
        CHECK(dlclose(h) == 0);
    }
    void *h = dlopen(final, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    void *(*hold)(void) = (void *(*)(void))dlsym(h, "final_hold");
    CHECK(hold != NULL && hold() != NULL);
    tm_holder_t rows[64];
    size_t count = 0;
    size_t (*get_holders)(tm_holder_t *, size_t, size_t) = (size_t (*)(tm_holder_t *, size_t, size_t))dlsym(RTLD_DEFAULT, "tm_get_holders");
    if (get_holders) {
        count = get_holders(rows, 64, sizeof rows[0]);
    } else {
        /* A library from before TM_HOLDER_VERSION 3: its tm_holders wrote this layout. */
        struct { char name[64]; int32_t place, cached; uint64_t live, peak, blocks, unused; } old[64];
        size_t (*holders)(void *, size_t) = (size_t (*)(void *, size_t))dlsym(RTLD_DEFAULT, "tm_holders");
        if (!holders) {
            printf("no holders table\n");
            return 0;
        }
        count = holders(old, 64);
        for (size_t i = 0; i < count && i < 64; i++) {
            memcpy(rows[i].name, old[i].name, 64);
            rows[i].place = old[i].place, rows[i].cached = old[i].cached, rows[i].live_bytes = old[i].live, rows[i].blocks = old[i].blocks;
        }
    }
    printf("rows: %zu\n", count);
    for (size_t i = 0; i < count && i < 64; i++)
        printf("ROW %s|%d|%d|%llu|%llu\n", rows[i].name, rows[i].place, rows[i].cached, (unsigned long long)rows[i].live_bytes, (unsigned long long)rows[i].blocks);
    return 0;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "work";
    if (strcmp(what, "work") == 0) return work();
    if (strcmp(what, "limit") == 0 && argc > 3) return limit(argv[2], atol(argv[3]), argc > 4 ? argv[4] : "as", argc > 5 && strcmp(argv[5], "small") == 0);
    if (strcmp(what, "limit-race") == 0 && argc > 2) return limit_race(atol(argv[2]));
    if (strcmp(what, "mlockall") == 0 && argc > 2) return lockall(atol(argv[2]));
    if (strcmp(what, "hugepage") == 0) return hugepage();
    if (strcmp(what, "spy") == 0) return spy();
    if (strcmp(what, "reload") == 0 && argc > 2) return reload(atol(argv[2]));
    fprintf(stderr, "footprint: unknown scenario\n");
    return 2;
}
