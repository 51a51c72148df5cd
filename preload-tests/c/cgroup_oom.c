/* Frees large blocks, then at once needs as much again another way, in a memory cgroup with
 * little room (Note [Hot within the memory] in src/host/cache/release.rs). `cgroup_oom MODE`
 * keeps 200 MiB live, makes three 40 MiB blocks (every page written) and frees them, then
 * without a pause: `small` writes 250 MiB of malloc(1000); `fork` has a child do that; `mmap`
 * maps 250 MiB itself and writes it. Prints "MODE: done" (the test runs it in a 512 MiB
 * cgroup; glibc alone peaks at about 453 MiB there) or is killed by the cgroup's OOM killer. */
#include "check.h"
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static void small_pieces(size_t total) {
    for (size_t i = 0; i < total / 1000; i++) {
        char *p = malloc(1000);
        CHECK(p);
        memset(p, 1, 1000);
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *mode = argv[1];
    char *live = malloc(200 * MB);
    CHECK(live);
    memset(live, 2, 200 * MB);
    char *blocks[3];
    for (int i = 0; i < 3; i++) {
        blocks[i] = malloc(40 * MB);
        CHECK(blocks[i]);
        memset(blocks[i], 3, 40 * MB);
    }
    for (int i = 0; i < 3; i++) free(blocks[i]);
    if (strcmp(mode, "fork") == 0) {
        pid_t child = fork();
        CHECK(child >= 0);
        if (child == 0) {
            small_pieces(250 * MB);
            _exit(0);
        }
        int status;
        CHECK(waitpid(child, &status, 0) == child);
        if (WIFSIGNALED(status)) {
            printf("fork: child killed by signal %d\n", WTERMSIG(status));
            return 1;
        }
    } else if (strcmp(mode, "mmap") == 0) {
        char *p = mmap(NULL, 250 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(p != MAP_FAILED);
        memset(p, 4, 250 * MB);
    } else {
        CHECK(strcmp(mode, "small") == 0);
        small_pieces(250 * MB);
    }
    printf("%s: done\n", mode);
    return 0;
}
