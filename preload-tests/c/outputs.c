/* Scenarios for the output files (issue 35), each a run of large requests (8 MiB each,
 * allocated, touched, freed):
 *   outputs wait N         prints its pid, waits for a line on stdin (the test plants files at
 *                          the names it will try meanwhile), then makes N requests
 *   outputs burst FD       waits for FD to close (the test closes it for 16 processes at
 *                          once), then makes (pid % 5) + 1 requests: a file's count names its
 *                          process
 *   outputs exec N M       makes N requests, then execs itself (same pid) to make M more and
 *                          print its pid
 *   outputs many N         N requests of sizes 4 to 12 MiB, none freed before the next: a long
 *                          trace (a full disk cuts it)
 *   outputs many-write N P as `many`, then writes 1 MiB to file P itself (past a file size
 *                          limit, SIGXFSZ is the program's, as without the library)
 *   outputs hold N         makes N requests, keeps the last one live, prints its pid and waits
 *                          for stdin to close (a process that runs while others read its files)
 *   outputs threads T N    T threads released at once make N requests each (the first of them
 *                          while the counters' file is being named), then it prints its pid and
 *                          waits for stdin to close */
#include "check.h"
#include <pthread.h>
#include <unistd.h>

static pthread_barrier_t start;
static int per_thread;

static void requests(int n, size_t size);

static void *worker(void *arg) {
    (void)arg;
    pthread_barrier_wait(&start);
    requests(per_thread, 8 * MB);
    return NULL;
}

static void requests(int n, size_t size) {
    for (int i = 0; i < n; i++) {
        char *p = malloc(size);
        CHECK(p);
        p[0] = 1;
        free(p);
    }
}

int main(int argc, char **argv) {
    CHECK(argc >= 3);
    const char *mode = argv[1];
    if (!strcmp(mode, "wait")) {
        printf("%d\n", (int)getpid());
        fflush(stdout);
        char line[16];
        CHECK(fgets(line, sizeof line, stdin));
        requests(atoi(argv[2]), 8 * MB);
        return 0;
    }
    if (!strcmp(mode, "burst")) {
        int fd = atoi(argv[2]);
        char c;
        while (read(fd, &c, 1) > 0) {
        }
        requests((int)(getpid() % 5) + 1, 8 * MB);
        return 0;
    }
    if (!strcmp(mode, "exec")) {
        CHECK(argc == 4);
        requests(atoi(argv[2]), 8 * MB);
        char *again[] = {argv[0], "second", argv[3], NULL};
        execv("/proc/self/exe", again);
        CHECK(!"exec failed");
    }
    if (!strcmp(mode, "second")) {
        requests(atoi(argv[2]), 8 * MB);
        printf("%d\n", (int)getpid());
        return 0;
    }
    if (!strcmp(mode, "many")) {
        int n = atoi(argv[2]);
        char *last = NULL;
        for (int i = 0; i < n; i++) {
            char *p = malloc((4 + (size_t)(i % 9)) * MB);
            CHECK(p);
            p[0] = 1;
            free(last);
            last = p;
        }
        free(last);
        return 0;
    }
    if (!strcmp(mode, "many-write") && argc > 3) {
        int n = atoi(argv[2]);
        for (int i = 0; i < n; i++) requests(1, (size_t)(4 + i % 9) * MB);
        static char buf[1 << 20];
        FILE *f = fopen(argv[3], "w");
        CHECK(f != NULL);
        size_t put = fwrite(buf, 1, sizeof buf, f);
        fclose(f);
        printf("wrote %zu bytes\n", put);
        return 0;
    }
    if (!strcmp(mode, "threads")) {
        CHECK(argc == 4);
        int n = atoi(argv[2]);
        per_thread = atoi(argv[3]);
        pthread_t t[64];
        CHECK(n > 0 && n <= 64);
        CHECK(pthread_barrier_init(&start, NULL, (unsigned)n) == 0);
        for (int i = 0; i < n; i++) CHECK(pthread_create(&t[i], NULL, worker, NULL) == 0);
        for (int i = 0; i < n; i++) CHECK(pthread_join(t[i], NULL) == 0);
        printf("%d\n", (int)getpid());
        fflush(stdout);
        char c;
        while (read(0, &c, 1) > 0) {
        }
        return 0;
    }
    if (!strcmp(mode, "hold")) {
        requests(atoi(argv[2]) - 1, 8 * MB);
        char *kept = malloc(8 * MB);
        CHECK(kept);
        kept[0] = 1;
        printf("%d\n", (int)getpid());
        fflush(stdout);
        char c;
        while (read(0, &c, 1) > 0) {
        }
        free(kept);
        return 0;
    }
    CHECK(!"unknown mode");
}
