/* A program that goes real-time (SCHED_FIFO, priority 10) and then uses large blocks: our
 * background thread, made then, runs under the normal policy (Note [Our threads are not
 * real-time] in src/sys/thread.rs). Prints each thread's name and policy from /proc, then
 * "realtime ok". Runs as root. */
#define _GNU_SOURCE
#include "check.h"
#include <dirent.h>
#include <sched.h>

int main(void) {
    struct sched_param fifo = {.sched_priority = 10};
    CHECK(sched_setscheduler(0, SCHED_FIFO, &fifo) == 0);
    for (int i = 0; i < 4; i++) {
        char *p = malloc(64 * MB);
        CHECK(p);
        p[i] = 1;
        free(p);
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
