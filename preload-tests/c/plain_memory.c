/* A freed large block comes back as plain memory whatever its previous owner did to its pages
 * (issue 19, case 1). `plain_memory MODE`, MODE one of rdonly, rx, guard, dontfork, wipeonfork,
 * mlock, dontdump, mergeable (KSM), guardregion (MADV_GUARD_INSTALL), unmapped (a page munmapped), fixedmap (a
 * shared page mapped over one), shrunk (mremap in place), raw-rdonly (mprotect by a raw system
 * call): 40 MiB blocks are written, MODE is applied to them, they are freed, and then
 *  - a forked child mallocs and callocs 40 and 64 MiB (reusing what the parent cached) and
 *    writes every page;
 *  - the next malloc(40 MiB), calloc(40 MiB) (every byte up to malloc_usable_size reads zero)
 *    and malloc(64 MiB) (gathered from two freed 40 MiB blocks, or fresh) are written in every
 *    page, their mappings are read-write with default advice (no ex/dc/wf/dd/lo/mg in VmFlags),
 *    and a forked child sees their contents intact;
 *  - mlock: VmLck drops to (near) zero once the block is freed, and with the library loaded
 *    an idle block released after a locked one is still MADV_FREE'd (LazyFree in smaps).
 * Prints "plain memory MODE ok" (or "plain memory MODE skipped: ..." when mlock is not
 * permitted). Runs the same with and without the library. */
#define _GNU_SOURCE /* mremap */
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <malloc.h>
#include "check.h"

#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18
#endif

#define PAGE 4096UL
#define BLOCK (40 * MB)
#define BIG (64 * MB)

static const char *mode;
static int failures;

#define FAIL(...)                                                                  \
    do {                                                                           \
        fprintf(stderr, "FAIL (%s) line %d: ", mode, __LINE__);                    \
        fprintf(stderr, __VA_ARGS__);                                              \
        fputc('\n', stderr);                                                       \
        failures++;                                                                \
    } while (0)

/* Every page (and the last byte) written, then read back. */
static void write_all(unsigned char *p, size_t n, unsigned seed, const char *what) {
    fill(p, n, seed);
    if (!filled(p, n, seed)) FAIL("%s: does not read back what was written", what);
}

static int all_zero(const unsigned char *p, size_t n, size_t *at) {
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < n / 8; i++)
        if (w[i]) {
            *at = i * 8;
            return 0;
        }
    for (size_t i = n / 8 * 8; i < n; i++)
        if (p[i]) {
            *at = i;
            return 0;
        }
    return 1;
}

/* Every mapping overlapping [p, p+n) is private read-write, not executable, with default fork
 * and dump advice and not locked. One pass over smaps. */
static void check_plain_mappings(const void *p, size_t n, const char *what) {
    uintptr_t lo_want = (uintptr_t)p & ~(PAGE - 1), hi_want = (uintptr_t)p + n;
    FILE *f = fopen("/proc/self/smaps", "r");
    CHECK(f);
    char line[1024];
    int in = 0;
    size_t covered = 0;
    unsigned long cur_lo = 0, cur_hi = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s ", &lo, &hi, perms) == 3 && strchr(line, '-') < strchr(line, ' ')) {
            in = lo < hi_want && hi > lo_want;
            cur_lo = lo;
            cur_hi = hi;
            if (in) {
                unsigned long a = lo > lo_want ? lo : lo_want, b = hi < hi_want ? hi : hi_want;
                covered += b - a;
                if (strcmp(perms, "rw-p") != 0) FAIL("%s: mapping %lx-%lx is %s, not rw-p", what, lo, hi, perms);
            }
            continue;
        }
        if (in && strncmp(line, "VmFlags:", 8) == 0) {
            line[strcspn(line, "\n")] = 0;
            static const char *bad[] = {" ex", " dc", " wf", " dd", " lo", " mg"};
            for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
                char *hit = strstr(line + 8, bad[i]);
                if (hit && (hit[3] == ' ' || hit[3] == 0))
                    FAIL("%s: mapping %lx-%lx has VmFlags%s (%s)", what, cur_lo, cur_hi, bad[i], line + 9);
            }
        }
    }
    fclose(f);
    if (covered < hi_want - lo_want) FAIL("%s: only %zu of %zu bytes mapped", what, covered, (size_t)(hi_want - lo_want));
}

/* The page-aligned inside of a block (the whole block when it starts on a page). */
static void inner(void *p, size_t n, uintptr_t *lo, size_t *len) {
    uintptr_t a = ((uintptr_t)p + PAGE - 1) & ~(PAGE - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~(PAGE - 1);
    *lo = a;
    *len = b - a;
}

/* What the previous owner does to its block before freeing it. */
static void taint(void *p, size_t n) {
    uintptr_t lo;
    size_t len;
    inner(p, n, &lo, &len);
    void *a = (void *)lo;
    if (!strcmp(mode, "rdonly")) {
        CHECK(mprotect(a, len, PROT_READ) == 0);
    } else if (!strcmp(mode, "rx")) {
        CHECK(mprotect(a, len, PROT_READ | PROT_EXEC) == 0);
    } else if (!strcmp(mode, "guard")) {
        CHECK(mprotect((char *)a + (len / 2 & ~(PAGE - 1)), PAGE, PROT_NONE) == 0);
    } else if (!strcmp(mode, "dontfork")) {
        CHECK(madvise(a, len, MADV_DONTFORK) == 0);
    } else if (!strcmp(mode, "wipeonfork")) {
        CHECK(madvise(a, len, MADV_WIPEONFORK) == 0);
    } else if (!strcmp(mode, "dontdump")) {
        CHECK(madvise(a, len, MADV_DONTDUMP) == 0);
    } else if (!strcmp(mode, "mergeable")) {
        if (madvise(a, len, MADV_MERGEABLE) != 0) {
            printf("plain memory %s skipped: MADV_MERGEABLE: %s (a kernel without KSM)\n", mode, strerror(errno));
            exit(0);
        }
    } else if (!strcmp(mode, "guardregion")) {
        /* MADV_GUARD_INSTALL (Linux 6.13): faults on access, kept across MADV_DONTNEED. */
        if (madvise((char *)a + (len / 2 & ~(PAGE - 1)), PAGE, 102) != 0) {
            printf("plain memory %s skipped: MADV_GUARD_INSTALL: %s (before Linux 6.13)\n", mode, strerror(errno));
            exit(0);
        }
    } else if (!strcmp(mode, "unmapped")) {
        CHECK(munmap((char *)a + (len / 2 & ~(PAGE - 1)), PAGE) == 0);
    } else if (!strcmp(mode, "fixedmap")) {
        /* A shared page mapped over the middle: glibc's free unmaps it with the block. */
        void *q = (char *)a + (len / 2 & ~(PAGE - 1));
        CHECK(mmap(q, PAGE, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED | MAP_ANONYMOUS, -1, 0) == q);
    } else if (!strcmp(mode, "shrunk")) {
        /* mremap shrinks the mapping in place: the block's second half is gone. */
        void *r = mremap(a, len, len / 2 & ~(PAGE - 1), 0);
        if (r != a) FAIL("mremap: %s", strerror(errno));
    } else if (!strcmp(mode, "raw-rdonly")) {
        /* Past libc: only TENSORMALLOC_RESET=always sees it (docs/limits.md). */
        CHECK(syscall(SYS_mprotect, a, len, PROT_READ) == 0);
    } else if (!strcmp(mode, "mlock")) {
        if (mlock(p, n) != 0) {
            printf("plain memory %s skipped: mlock: %s\n", mode, strerror(errno));
            exit(0);
        }
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        exit(2);
    }
}

static void wait_child(pid_t pid, const char *what) {
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status))
        FAIL("%s: child killed by signal %d (%s)", what, WTERMSIG(status), strsignal(WTERMSIG(status)));
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL("%s: child exited %d", what, WEXITSTATUS(status));
}

/* A child of the next owner sees its data, and can write its own copy. */
static void check_in_child(unsigned char *p, size_t n, unsigned seed, const char *what) {
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (!filled(p, n, seed)) {
            fprintf(stderr, "FAIL (%s): %s: the forked child does not see the data (first page reads %d)\n", mode, what, p[0]);
            _exit(1);
        }
        fill(p, n, seed + 1);
        _exit(filled(p, n, seed + 1) ? 0 : 1);
    }
    wait_child(pid, what);
    if (!filled(p, n, seed)) FAIL("%s: the parent's data changed after the child wrote its copy", what);
}

/* A forked child reuses what the parent cached: malloc, calloc and a bigger malloc. */
static void child_allocates(void) {
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        unsigned char *a = malloc(BLOCK);
        CHECK(a);
        fill(a, BLOCK, 11);
        if (!filled(a, BLOCK, 11)) _exit(1);
        unsigned char *c = calloc(1, BLOCK);
        CHECK(c);
        size_t at;
        if (!all_zero(c, malloc_usable_size(c), &at)) {
            fprintf(stderr, "FAIL (%s): child's calloc: byte %zu not zero\n", mode, at);
            _exit(1);
        }
        fill(c, BLOCK, 12);
        unsigned char *b = malloc(BIG);
        CHECK(b);
        fill(b, BIG, 13);
        if (!filled(a, BLOCK, 11) || !filled(c, BLOCK, 12) || !filled(b, BIG, 13)) _exit(1);
        free(a);
        free(c);
        free(b);
        _exit(0);
    }
    wait_child(pid, "a child allocating from the parent's cache");
}

enum next { NEXT_MALLOC, NEXT_CALLOC, NEXT_BIGGER };

static void round_(enum next kind) {
    static const char *names[] = {"malloc(40 MiB)", "calloc(40 MiB)", "malloc(64 MiB) over two freed blocks"};
    const char *what = names[kind];
    int ntaint = kind == NEXT_BIGGER ? 2 : 1;
    void *t[2];
    for (int i = 0; i < ntaint; i++) {
        t[i] = malloc(BLOCK);
        CHECK(t[i]);
        write_all(t[i], BLOCK, 3 + i, "the first owner's block");
        taint(t[i], BLOCK);
    }
    for (int i = 0; i < ntaint; i++) free(t[i]);
    if (!strcmp(mode, "mlock")) {
        long kb = status_kb("VmLck");
        if (kb > 1024) FAIL("VmLck is %ld kB with no locked block live (freed blocks stay locked)", kb);
    }
    if (kind == NEXT_MALLOC) child_allocates();

    size_t n = kind == NEXT_BIGGER ? BIG : BLOCK;
    unsigned char *p = kind == NEXT_CALLOC ? calloc(n, 1) : malloc(n);
    CHECK(p);
    size_t usable = malloc_usable_size(p);
    CHECK(usable >= n);
    if (kind == NEXT_CALLOC) {
        size_t at;
        if (!all_zero(p, usable, &at)) FAIL("%s: byte %zu of %zu usable is not zero", what, at, usable);
    }
    check_plain_mappings(p, usable, what);
    write_all(p, usable, 7 + kind, what);
    check_in_child(p, usable, 7 + kind, what);
    free(p);
}

static uint64_t released(void) {
    tm_stats_t s;
    CHECK(tm_stats(&s) == 0);
    return s.host_released_blocks;
}

/* Bounded wait (10 s) for the idle-release count to reach `want`. */
static int wait_released(uint64_t want) {
    for (int i = 0; i < 1000; i++) {
        if (released() >= want) return 1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* A locked block is freed and released; the next idle block is still released with MADV_FREE
 * (its pages show as LazyFree), not dropped with MADV_DONTNEED. */
static void madv_free_after_locked_block(void) {
    size_t (*trim)(void) = (size_t (*)(void))dlsym(RTLD_DEFAULT, "tm_trim");
    CHECK(trim);
    trim();
    uint64_t base = released();
    unsigned char *q = malloc(BIG);
    CHECK(q);
    memset(q, 5, BIG);
    unsigned char *p = malloc(BLOCK);
    CHECK(p);
    memset(p, 6, BLOCK);
    CHECK(mlock(p, BLOCK) == 0);
    free(p);
    if (!wait_released(base + 1)) FAIL("the freed locked block was never released");
    free(q);
    if (!wait_released(base + 2)) FAIL("the idle block freed after it was never released");
    long lazy = smaps_kb((uintptr_t)q, "LazyFree");
    if (lazy < 32 * 1024)
        FAIL("an idle 64 MiB block released after a locked one shows %ld kB LazyFree (MADV_FREE switched off?)", lazy);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    mode = argv[1];
    if (!strcmp(mode, "mlock")) {
        /* Best effort: root may lack CAP_SYS_RESOURCE but have CAP_IPC_LOCK (then the limit
         * does not apply); mlock failing skips the mode. */
        struct rlimit r = {RLIM_INFINITY, RLIM_INFINITY};
        if (setrlimit(RLIMIT_MEMLOCK, &r) != 0 && getrlimit(RLIMIT_MEMLOCK, &r) == 0) {
            r.rlim_cur = r.rlim_max;
            setrlimit(RLIMIT_MEMLOCK, &r);
        }
    }
    round_(NEXT_MALLOC);
    round_(NEXT_CALLOC);
    round_(NEXT_BIGGER);
    tm_stats_t s;
    int ours = tm_stats(&s) == 0 && s.enabled;
    if (!strcmp(mode, "mlock")) {
        long kb = status_kb("VmLck");
        if (kb > 1024) FAIL("VmLck is %ld kB at the end with nothing live", kb);
        if (ours) madv_free_after_locked_block();
    }
    if (failures) {
        fprintf(stderr, "plain memory %s: %d failures\n", mode, failures);
        return 1;
    }
    printf("plain memory %s ok\n", mode);
    return 0;
}
