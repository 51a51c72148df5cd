/* A vfork child (it runs in its parent's memory, and no fork handler runs for it) that mallocs
 * and frees a large block, then exits: undefined by POSIX, common in practice, and fine under
 * glibc alone (Note [A child in our memory] in src/sys/reaper.rs). Then the parent:
 *   pthread-exit: registers an atexit handler, prints, and ends main with pthread_exit, which
 *                 must end the process (stdout flushed, the handler run);
 *   release:      frees 256 MiB it wrote and must see its RSS fall within 5 s;
 *   exec:         the child execs /bin/true instead of exiting; the parent's next large
 *                 requests must not sleep on a lock the child's thread held (one run in a
 *                 hundred, so the test runs it many times).
 * Usage: vfork_child MODE */
#include "check.h"
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

static void said_bye(void) { printf("atexit handler ran\n"); }

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK(f);
    long size, resident;
    CHECK(fscanf(f, "%ld %ld", &size, &resident) == 2);
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *mode = argv[1];
    int exec = !strcmp(mode, "exec");
    pid_t pid = vfork();
    if (pid == 0) {
        char *x = malloc(8 * MB);
        if (!x) _exit(2);
        x[0] = 1;
        free(x);
        if (exec) execl("/bin/true", "true", (char *)NULL);
        _exit(0);
    }
    CHECK(pid > 0);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!strcmp(mode, "pthread-exit")) {
        CHECK(atexit(said_bye) == 0);
        printf("main leaves\n");
        pthread_exit(NULL);
    } else if (!strcmp(mode, "release")) {
        char *b[4];
        for (int i = 0; i < 4; i++) {
            CHECK((b[i] = malloc(64 * MB)));
            memset(b[i], i + 1, 64 * MB);
        }
        for (int i = 0; i < 4; i++) free(b[i]);
        long rss = rss_kb();
        for (int i = 0; i < 50 && rss > 64 * 1024; i++) {
            usleep(100 * 1000);
            rss = rss_kb();
        }
        printf("%s: rss %ld kB\n", rss <= 64 * 1024 ? "released" : "held", rss);
    } else if (exec) {
        for (int i = 0; i < 5; i++) {
            char *x = malloc(16 * MB);
            CHECK(x);
            x[0] = 2;
            free(x);
        }
        printf("exec ok\n");
    } else {
        fprintf(stderr, "vfork_child: unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
