/* Our background thread made by a helper thread the program set apart: SCHED_IDLE, pinned to
 * one CPU, 20 s of timer slack. The helper frees the first large block, which makes ours (Note
 * [Our threads are the process's] in src/sys/thread.rs). Prints, for each thread but the
 * helper, "NAME policy P cpus LIST slack NS", then "helper ok". */
#define _GNU_SOURCE
#include "check.h"
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

static void *helper(void *arg) {
    (void)arg;
    struct sched_param none = {0};
    CHECK(sched_setscheduler(0, SCHED_IDLE, &none) == 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0);
    CHECK(prctl(PR_SET_TIMERSLACK, 20UL * 1000 * 1000 * 1000, 0, 0, 0) == 0);
    prctl(PR_SET_NAME, "helper", 0, 0, 0);
    for (int i = 0; i < 4; i++) {
        char *p = malloc(64 * MB);
        CHECK(p);
        p[i] = 1;
        free(p);
    }
    return NULL;
}

static void read_line(const char *path, const char *key, char *out, size_t n) {
    FILE *f = fopen(path, "r");
    CHECK(f);
    char line[512];
    out[0] = 0;
    while (fgets(line, sizeof line, f)) {
        if (!key || !strncmp(line, key, strlen(key))) {
            const char *v = key ? line + strlen(key) : line;
            while (*v == ' ' || *v == '\t') v++;
            snprintf(out, n, "%s", v);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    }
    fclose(f);
}

int main(void) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, helper, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    usleep(300 * 1000); /* ours names itself as it begins */
    DIR *tasks = opendir("/proc/self/task");
    CHECK(tasks);
    struct dirent *e;
    while ((e = readdir(tasks))) {
        if (e->d_name[0] == '.') continue;
        char path[128], comm[64], cpus[256], slack[64], stat[1024];
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        read_line(path, NULL, comm, sizeof comm);
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        read_line(path, "Cpus_allowed_list:", cpus, sizeof cpus);
        snprintf(path, sizeof path, "/proc/%s/timerslack_ns", e->d_name); /* a thread id works there too */
        read_line(path, NULL, slack, sizeof slack);
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        read_line(path, NULL, stat, sizeof stat);
        char *close = strrchr(stat, ')');
        CHECK(close);
        char *field = strtok(close + 2, " ");
        for (int k = 0; field && k < 38; k++) field = strtok(NULL, " ");
        CHECK(field);
        printf("%s policy %s cpus %s slack %s\n", comm, field, cpus, slack);
    }
    closedir(tasks);
    printf("helper ok\n");
    return 0;
}
