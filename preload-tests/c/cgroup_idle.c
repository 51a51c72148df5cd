/* What a memory cgroup's usage shows of idle cached blocks (Note [What RSS shows]): keeps LIVE MiB
 * of large blocks live (written), then writes and frees two 48 MiB blocks, waits past the release
 * delay, and prints the cgroup's usage (v1 memory.usage_in_bytes of its own cgroup) at each step
 * and, when the library is loaded, its split of the cache when idle, as one JSON line:
 * {"live": ..., "freed": ..., "idle": ..., "resident": ..., "lazyfree": ...} in bytes.
 * Usage: cgroup_idle LIVE_MIB WAIT_MS */
#include <unistd.h>
#include "check.h"

static long long cgroup_usage(void) {
    char line[512], path[768];
    FILE *f = fopen("/proc/self/cgroup", "r");
    CHECK(f);
    path[0] = 0;
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, ":memory:");
        if (p) {
            p += strlen(":memory:");
            p[strcspn(p, "\n")] = 0;
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.usage_in_bytes", p);
        }
    }
    fclose(f);
    CHECK(path[0]);
    f = fopen(path, "r");
    CHECK(f);
    long long usage = -1;
    CHECK(fscanf(f, "%lld", &usage) == 1);
    fclose(f);
    return usage;
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    size_t live_mib = (size_t)atol(argv[1]);
    long wait_ms = atol(argv[2]);
    enum { PARTS = 8 };
    char *live[PARTS];
    for (int i = 0; i < PARTS; i++) {
        live[i] = malloc(live_mib / PARTS * MB);
        CHECK(live[i]);
        memset(live[i], 1, live_mib / PARTS * MB);
    }
    long long at_live = cgroup_usage();
    char *a = malloc(48 * MB), *b = malloc(48 * MB);
    CHECK(a && b);
    memset(a, 2, 48 * MB);
    memset(b, 3, 48 * MB);
    free(a);
    free(b);
    long long at_freed = cgroup_usage();
    struct timespec ts = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    long long at_idle = cgroup_usage();
    tm_stats_t s;
    tm_stats(&s);
    printf("{\"live\": %lld, \"freed\": %lld, \"idle\": %lld, \"resident\": %llu, \"lazyfree\": %llu}\n", at_live, at_freed, at_idle,
           (unsigned long long)s.host_cached_resident_bytes, (unsigned long long)s.host_cached_lazyfree_bytes);
    for (int i = 0; i < PARTS; i++) free(live[i]);
    return 0;
}
