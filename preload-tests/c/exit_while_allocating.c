/* Three threads make large requests (0.5-3.5 MiB) while main ends the process: `exit` (the exit
 * hooks run while the threads still allocate) or `quit` (_exit: no hook, a file left for the
 * parent to count). Under TENSORMALLOC_STATS=1 a normal exit must leave no counters file behind
 * (Note [No file after the exit hook] in src/record/ledger/mod.rs). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *allocate(void *arg) {
    (void)arg;
    for (int i = 0;; i++) {
        char *volatile p = malloc((size_t)((i % 7) + 1) << 19);
        p[0] = 1;
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t t;
    for (int i = 0; i < 3; i++) pthread_create(&t, NULL, allocate, NULL);
    usleep(argc > 1 && strcmp(argv[1], "quit") == 0 ? 3000 : 20000);
    if (argc > 1 && strcmp(argv[1], "quit") == 0) _exit(0);
    exit(0);
}
