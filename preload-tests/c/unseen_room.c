/* Room that no call of ours sees being taken (Note [Room for others], rule 1). Under RLIMIT_AS
 * or RLIMIT_DATA (1 GiB), the program fills what it may map until 136 MiB are left, frees a
 * 120 MiB block it wrote, then takes the room in a way the kernel charges without a libc call
 * we could retry: the stack growing by 6 MiB, sbrk of 64 MiB, or mprotect of a 64 MiB
 * read-only mapping to writable (a JIT's reserve-then-commit). glibc's free unmapped the block,
 * so each one fits. Prints "room ok OP" or "room FAIL OP". Usage: unseen_room as|data OP */
#include "check.h"
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

static void on_segv(int sig) {
    (void)sig;
    static const char m[] = "room FAIL stack (SIGSEGV: it could not grow)\n";
    write(1, m, sizeof m - 1);
    _exit(0);
}

static int recurse(long depth) {
    volatile char frame[64 * 1024];
    memset((char *)frame, (int)depth, sizeof frame);
    return depth > 0 ? recurse(depth - 1) + frame[100] : frame[7];
}

/* Maps `prot` chunks until the limit refuses one, then unmaps `room` bytes of one big enough. */
static void fill_leaving(size_t room, int prot) {
    char *big = NULL;
    for (size_t chunk = 256 * MB; chunk >= 4096;) {
        char *p = mmap(NULL, chunk, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            chunk /= 2;
            continue;
        }
        if (!big && chunk >= room) big = p;
    }
    CHECK(big && munmap(big, room) == 0);
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    int as = !strcmp(argv[1], "as");
    const char *op = argv[2];
    static char alt[64 * 1024];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
    CHECK(sigaltstack(&ss, NULL) == 0);
    struct sigaction sa = {.sa_handler = on_segv, .sa_flags = SA_ONSTACK};
    CHECK(sigaction(SIGSEGV, &sa, NULL) == 0);
    struct rlimit rl = {1024 * MB, 1024 * MB};
    CHECK(setrlimit(as ? RLIMIT_AS : RLIMIT_DATA, &rl) == 0);
    /* RLIMIT_AS counts every mapping; RLIMIT_DATA private writable ones. */
    fill_leaving(136 * MB, as ? PROT_NONE : PROT_READ | PROT_WRITE);
    char *block = malloc(120 * MB);
    CHECK(block);
    memset(block, 1, 120 * MB);
    free(block);
    int fine;
    if (!strcmp(op, "stack")) {
        volatile int sink = recurse(6 * 16); /* 6 MiB of 64 KiB frames */
        (void)sink;
        fine = 1;
    } else if (!strcmp(op, "sbrk")) {
        fine = sbrk(64 * MB) != (void *)-1;
    } else if (!strcmp(op, "mprotect")) {
        char *p = mmap(NULL, 64 * MB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(p != MAP_FAILED);
        fine = mprotect(p, 64 * MB, PROT_READ | PROT_WRITE) == 0;
    } else {
        fprintf(stderr, "unseen_room: unknown op %s\n", op);
        return 2;
    }
    printf("room %s %s\n", fine ? "ok" : "FAIL", op);
    return 0;
}
