/* Our thread is a task, which RLIMIT_NPROC counts (Note [Our thread's task] in
 * src/sys/reaper.rs): a program that limits its user's tasks to what it has plus two, then frees
 * a large block (our thread starts), must still make its two threads, as under glibc alone.
 * Run as root, it first becomes user 65534 (root's tasks are not limited). */
#include "check.h"
#include <dirent.h>
#include <grp.h>
#include <pthread.h>
#include <unistd.h>

/* The tasks (threads) of `uid` now, from /proc. */
static long tasks_of(uid_t uid) {
    long n = 0;
    DIR *d = opendir("/proc");
    CHECK(d != NULL);
    struct dirent *e;
    char path[300], line[256];
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        long uid_seen = -1, threads = 0;
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "Uid:", 4)) uid_seen = strtol(line + 4, NULL, 10);
            if (!strncmp(line, "Threads:", 8)) threads = strtol(line + 8, NULL, 10);
        }
        fclose(f);
        if (uid_seen == (long)uid) n += threads;
    }
    closedir(d);
    return n;
}

static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;

static void *wait_at_gate(void *arg) {
    (void)arg;
    pthread_mutex_lock(&gate);
    pthread_mutex_unlock(&gate);
    return NULL;
}

int main(void) {
    if (getuid() == 0) {
        CHECK(setgroups(0, NULL) == 0 && setresgid(65534, 65534, 65534) == 0 && setresuid(65534, 65534, 65534) == 0);
    }
    long start_kb = status_kb("RssAnon");
    /* What the program needs: its tasks now and two threads. */
    long n = tasks_of(getuid());
    struct rlimit rl = {(rlim_t)(n + 2), (rlim_t)(n + 2)};
    CHECK(setrlimit(RLIMIT_NPROC, &rl) == 0);
    char *p = malloc(64 * MB);
    CHECK(p != NULL);
    memset(p, 1, 64 * MB);
    free(p);
    usleep(100000); /* our thread, if any, is made by now */
    pthread_mutex_lock(&gate);
    pthread_t t[2];
    int made = 0;
    for (; made < 2; made++) {
        int rc = pthread_create(&t[made], NULL, wait_at_gate, NULL);
        if (rc != 0) {
            printf("thread %d refused: %s\n", made + 1, strerror(rc));
            break;
        }
    }
    /* Ours gave its task back: the block it would have released is not held meanwhile. */
    long held_mb = (status_kb("RssAnon") - start_kb) / 1024;
    printf("held after the threads were made: %ld MB\n", held_mb);
    pthread_mutex_unlock(&gate);
    for (int i = 0; i < made; i++) pthread_join(t[i], NULL);
    CHECK(held_mb < 32);
    /* The cache still works, with or without our thread. */
    p = malloc(64 * MB);
    CHECK(p != NULL);
    memset(p, 2, 64 * MB);
    free(p);
    printf("threads made: %d\n", made);
    CHECK(made == 2);
    puts("nproc ok");
    return 0;
}
