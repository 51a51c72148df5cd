/* The process's own peak RSS in MB (VmHWM): getrusage's ru_maxrss keeps the parent's peak
 * across fork and exec, so under the Python runner it would report the runner's. */
#include <stdio.h>

static double peak_rss_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib / 1024.0;
}
