/* A program that goes real-time (SCHED_FIFO, priority 10) and then uses large blocks: our
 * background thread, made then, runs under the normal policy (Note [Our threads are not
 * real-time] in src/sys/thread.rs). Prints each thread's name and policy from /proc, then
 * "realtime ok". Our thread names itself once it runs, and this SCHED_FIFO thread keeps a busy
 * CPU from it until it sleeps: the names are read once no thread but this one still has the
 * program's (bounded: 5 s). Runs as root. */
#define _GNU_SOURCE
#include "check.h"
#include <dirent.h>
#include <sched.h>
#include <unistd.h>

/* Threads other than this one still named as the program. */
static int unnamed_threads(void) {
    int n = 0;
    char self[32];
    snprintf(self, sizeof self, "%d", (int)getpid());
    DIR *tasks = opendir("/proc/self/task");
    CHECK(tasks);
    struct dirent *e;
    while ((e = readdir(tasks))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, self)) continue;
        char path[64], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof comm, f) && !strncmp(comm, "realtime", 8)) n++;
        fclose(f);
    }
    closedir(tasks);
    return n;
}

int main(void) {
    struct sched_param fifo = {.sched_priority = 10};
    CHECK(sched_setscheduler(0, SCHED_FIFO, &fifo) == 0);
    for (int i = 0; i < 4; i++) {
        char *p = malloc(64 * MB);
        CHECK(p);
        p[i] = 1;
        free(p);
    }
    for (int waited_ms = 0; waited_ms < 5000 && unnamed_threads() > 0; waited_ms += 10) {
        struct timespec ten = {0, 10 * 1000 * 1000};
        nanosleep(&ten, NULL);
    }
    DIR *tasks = opendir("/proc/self/task");
    CHECK(tasks);
    struct dirent *e;
    while ((e = readdir(tasks))) {
        if (e->d_name[0] == '.') continue;
        char path[64], line[1024];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        CHECK(f && fgets(line, sizeof line, f));
        fclose(f);
        char *open = strchr(line, '('), *close = strrchr(line, ')');
        CHECK(open && close);
        *close = 0;
        /* The 41st field: the 39th after the command. */
        char *field = strtok(close + 2, " ");
        for (int k = 0; field && k < 38; k++) field = strtok(NULL, " ");
        CHECK(field);
        printf("%s %s\n", open + 1, field);
    }
    closedir(tasks);
    printf("realtime ok\n");
    return 0;
}
