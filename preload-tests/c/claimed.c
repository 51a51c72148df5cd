/* Pages a program puts where a large block it freed was, and a block it changed then grew: as
 * under glibc alone, whose free unmapped the block and whose realloc copies a changed one.
 * `claimed MODE`:
 *  - fixed: a 16 MiB block is written and freed, the program maps 2 MiB of its own (MAP_FIXED)
 *    inside where it was and writes them; the next malloc(16 MiB) must not overlap them, and
 *    writing it, an idle pause (the background release and unmap: the test sets them short)
 *    and malloc_trim must leave them intact;
 *  - noreplace: the same with MAP_FIXED_NOREPLACE over (almost) the whole freed block: it must
 *    succeed;
 *  - munmap: the program unmaps 1 MiB of the freed block (harmless under glibc); the next
 *    malloc(16 MiB) must be writable in every page;
 *  - shm-freed: a 2 MiB SysV segment attached (shmat) inside the freed block must attach, and
 *    stay intact as in `fixed`;
 *  - shm-remap, shm-detach: one attached with SHM_REMAP inside a live block, which is then
 *    freed (detached first with shm-detach): the next blocks must neither be the segment (it
 *    stays intact while they are written) nor have a hole.
 *  - grow-ro, grow-dontfork, grow-wipeonfork, grow-mlock: 1 MiB in the middle of a written
 *    16 MiB block is made read-only, kept from children, wiped in children or locked; realloc
 *    to 64 MiB must give a block writable in every page, unlocked (VmLck 0), whose contents a
 *    forked child sees.
 * Prints "claimed MODE ok". */
#define _GNU_SOURCE
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>
#include <malloc.h>
#include "check.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18
#endif

#define BLOCK (16 * MB)

static int all(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != v || p[i + 4095 < n ? i + 4095 : n - 1] != v) return 0;
    return 1;
}

static int overlaps(const unsigned char *a, size_t an, const unsigned char *b, size_t bn) {
    return a < b + bn && b < a + an;
}

static void claim(const char *mode) {
    unsigned char *p = malloc(BLOCK);
    CHECK(p);
    memset(p, 1, BLOCK);
    free(p);
    int noreplace = !strcmp(mode, "noreplace");
    if (!strcmp(mode, "munmap")) {
        CHECK(munmap((void *)(((uintptr_t)p + 4 * MB) & ~4095UL), MB) == 0);
        unsigned char *r = malloc(BLOCK);
        CHECK(r);
        memset(r, 3, BLOCK);
        CHECK(all(r, BLOCK, 3));
        free(r);
        return;
    }
    /* Page-aligned inside the freed block (glibc's pointer is 16 bytes into its mapping). */
    unsigned char *at = (unsigned char *)(((uintptr_t)p + (noreplace ? 4095 : 2 * MB)) & ~4095UL);
    size_t len = noreplace ? BLOCK - 4096 : 2 * MB;
    unsigned char *q = mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (noreplace ? MAP_FIXED_NOREPLACE : MAP_FIXED), -1, 0);
    if (q == MAP_FAILED) {
        fprintf(stderr, "FAIL: mmap at a freed block's address: %s\n", strerror(errno));
        exit(1);
    }
    CHECK(q == at);
    memset(q, 0x42, len);
    unsigned char *r = malloc(BLOCK);
    CHECK(r);
    CHECK(!overlaps(r, BLOCK, q, len));
    memset(r, 7, BLOCK);
    CHECK(all(q, len, 0x42));
    free(r);
    usleep(400 * 1000); /* the background release and unmap, set short by the test */
    CHECK(all(q, len, 0x42));
    malloc_trim(0);
    CHECK(all(q, len, 0x42));
    munmap(q, len);
}

static void shm(const char *how) {
    int id = shmget(IPC_PRIVATE, 2 * MB, IPC_CREAT | 0600);
    if (id < 0) {
        printf("claimed shm-%s skipped: shmget: %s\n", how, strerror(errno));
        exit(0);
    }
    unsigned char *p = malloc(BLOCK);
    CHECK(p);
    memset(p, 1, BLOCK);
    unsigned char *at = (unsigned char *)(((uintptr_t)p + 4 * MB) & ~(SHMLBA - 1UL));
    int freed = !strcmp(how, "freed");
    if (freed) free(p);
    unsigned char *seg = shmat(id, at, freed ? 0 : SHM_REMAP);
    if (seg == (void *)-1) {
        fprintf(stderr, "FAIL: shmat inside a %s block: %s\n", freed ? "freed" : "live", strerror(errno));
        exit(1);
    }
    CHECK(seg == at);
    memset(seg, 0x42, 2 * MB);
    if (!strcmp(how, "detach")) CHECK(shmdt(seg) == 0);
    /* Attached over a live block, the segment goes with the block's range at its free (glibc
     * unmaps it): only its contents, seen through a second attachment, are checked then. */
    if (!freed) free(p);
    for (int i = 0; i < 3; i++) {
        unsigned char *r = malloc(BLOCK);
        CHECK(r);
        memset(r, 7, BLOCK);
        CHECK(all(r, BLOCK, 7));
        if (freed) CHECK(all(seg, 2 * MB, 0x42));
        free(r);
    }
    malloc_trim(0);
    unsigned char *again = shmat(id, NULL, SHM_RDONLY);
    CHECK(again != (void *)-1);
    CHECK(all(again, 2 * MB, 0x42));
    shmdt(again);
    if (freed) {
        CHECK(all(seg, 2 * MB, 0x42));
        shmdt(seg);
    }
    shmctl(id, IPC_RMID, NULL);
}

/* grow-HOW: 16 MiB to 64 MiB; grow-HOW-within: 5,000,000 to 5,500,000 bytes and 200,000 to
 * 250,000, each inside the rounding of the block first handed out (6 MiB, 256 KiB). */
static void grow_one(const char *how, size_t size, size_t grown) {
    unsigned char *p = malloc(size);
    CHECK(p);
    memset(p, 1, size);
    size_t part_len = size / 4 < MB ? (size / 4) & ~4095UL : MB;
    unsigned char *part = (unsigned char *)(((uintptr_t)p + size / 4) & ~4095UL);
    int r = -1;
    if (!strncmp(how, "ro", 2)) r = mprotect(part, part_len, PROT_READ);
    else if (!strncmp(how, "dontfork", 8)) r = madvise(part, part_len, MADV_DONTFORK);
    else if (!strncmp(how, "wipeonfork", 10)) r = madvise(part, part_len, MADV_WIPEONFORK);
    else if (!strncmp(how, "mlock", 5)) r = mlock(part, part_len);
    if (r != 0) {
        printf("claimed grow-%s skipped: %s\n", how, strerror(errno));
        exit(0);
    }
    unsigned char *q = realloc(p, grown);
    CHECK(q);
    CHECK(all(q, size, 1));
    memset(q, 5, grown);
    CHECK(status_kb("VmLck") == 0);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) _exit(all(q, grown, 5) ? 0 : 3);
    int status;
    CHECK(waitpid(child, &status, 0) == child);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "FAIL: the child saw the grown block wrongly (status %#x)\n", status);
        exit(1);
    }
    free(q);
}

static void grow(const char *how) {
    if (strstr(how, "-within")) {
        grow_one(how, 5000000, 5500000);
        grow_one(how, 200000, 250000);
    } else {
        grow_one(how, BLOCK, 64 * MB);
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *mode = argv[1];
    if (!strncmp(mode, "grow-", 5)) grow(mode + 5);
    else if (!strncmp(mode, "shm-", 4)) shm(mode + 4);
    else claim(mode);
    printf("claimed %s ok\n", mode);
    return 0;
}
