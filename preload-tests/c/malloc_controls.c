/* glibc's malloc controls and inspection calls with large blocks: each answers as under glibc
 * alone (RSS after malloc_trim and after mallopt, mallinfo2's mmapped figures, malloc_info's
 * mmap total, malloc_stats on stderr). Usage: malloc_controls SCENARIO */
#include "check.h"
#include <malloc.h>
#include <unistd.h>

/* Ten 40 MiB blocks, written and freed: 400 MiB that a cache could keep. */
static void churn(void) {
    void *b[10];
    for (int i = 0; i < 10; i++) {
        b[i] = malloc(40 * MB);
        CHECK(b[i]);
        memset(b[i], i + 1, 40 * MB);
    }
    for (int i = 0; i < 10; i++) free(b[i]);
}

int main(int argc, char **argv) {
    const char *s = argc > 1 ? argv[1] : "";
    tm_stats_t st = {.size = sizeof st};
    int ours = tm_stats(&st) == 0 && st.enabled;
    if (!strcmp(s, "trim")) {
        churn();
        size_t before = rss_mib();
        int released = malloc_trim(0);
        size_t after = rss_mib();
        printf("rss before %zu MiB, after malloc_trim %zu MiB, released %d\n", before, after, released);
        CHECK(after < 40);
        if (ours) CHECK(before >= 40 && released == 1);
    } else if (!strcmp(s, "mallinfo")) {
        void *b[5];
        for (int i = 0; i < 5; i++) CHECK((b[i] = malloc(20 * MB)));
        struct mallinfo2 m2 = mallinfo2();
        printf("hblks %zu hblkhd %zu MiB\n", m2.hblks, m2.hblkhd / MB);
        CHECK(m2.hblks >= 5 && m2.hblkhd >= 100 * MB);
        for (int i = 0; i < 5; i++) free(b[i]);
        m2 = mallinfo2();
        CHECK(m2.hblkhd < 100 * MB);
        /* The free bytes held are part of the arena: arena - fordblks is what is in use (a
         * cache counted only in fordblks made it wrap around). */
        printf("arena %zu fordblks %zu\n", m2.arena, m2.fordblks);
        CHECK(m2.arena >= m2.fordblks && m2.arena - m2.fordblks < 100 * MB);
    } else if (!strcmp(s, "mmap-max")) {
        CHECK(mallopt(M_MMAP_MAX, 0) == 1);
        churn();
        size_t after = rss_mib();
        printf("rss after frees with M_MMAP_MAX=0: %zu MiB\n", after);
        CHECK(after < 40);
        void *p = malloc(40 * MB); /* served from the heap now, ours or not */
        CHECK(p);
        memset(p, 1, 40 * MB);
        if (ours) {
            CHECK(tm_stats(&st) == 0 && st.host_live_bytes == 0);
        }
        free(p);
    } else if (!strcmp(s, "trim-threshold")) {
        CHECK(mallopt(M_TRIM_THRESHOLD, 1 << 20) == 1);
        churn();
        size_t after = rss_mib();
        printf("rss after frees with M_TRIM_THRESHOLD=1M: %zu MiB\n", after);
        CHECK(after < 40);
    } else if (!strcmp(s, "trim-threshold-never")) {
        /* glibc reads the value as a size_t: -1 is "never trim". A bound set before is lifted. */
        CHECK(mallopt(M_TRIM_THRESHOLD, 1 << 20) == 1);
        CHECK(mallopt(M_TRIM_THRESHOLD, -1) == 1);
        churn();
        if (ours) {
            CHECK(tm_stats(&st) == 0);
            printf("cached after frees with M_TRIM_THRESHOLD=-1: %llu MiB\n", (unsigned long long)(st.host_cached_bytes / MB));
            CHECK(st.host_cached_bytes >= 40 * MB);
        }
    } else if (!strcmp(s, "mmap-threshold")) {
        CHECK(mallopt(M_MMAP_THRESHOLD, 16 << 20) == 1);
        if (ours) CHECK(tm_stats(&st) == 0 && st.threshold_bytes == 16 << 20);
        void *small = malloc(8 * MB), *large = malloc(20 * MB);
        CHECK(small && large);
        if (ours) CHECK(tm_stats(&st) == 0 && st.host_live_bytes >= 20 * MB && st.host_live_bytes < 28 * MB);
        free(small);
        free(large);
        CHECK(mallopt(M_MMAP_THRESHOLD, 24 << 20) == 1);
        if (ours) CHECK(tm_stats(&st) == 0 && st.threshold_bytes == 24 << 20);
    } else if (!strcmp(s, "info")) {
        void *b[3];
        for (int i = 0; i < 3; i++) CHECK((b[i] = malloc(20 * MB)));
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        CHECK(f && malloc_info(0, f) == 0);
        fclose(f);
        const char *mm = strstr(text, "<total type=\"mmap\" count=\"");
        CHECK(mm);
        unsigned long count, size;
        CHECK(sscanf(mm, "<total type=\"mmap\" count=\"%lu\" size=\"%lu\"/>", &count, &size) == 2);
        printf("malloc_info mmap count %lu size %lu MiB\n", count, size / MB);
        CHECK(count >= 3 && size >= 60 * MB);
        CHECK(strstr(text, "</malloc>"));
        free(text);
        malloc_stats();
        for (int i = 0; i < 3; i++) free(b[i]);
    } else {
        CHECK(!"unknown scenario");
    }
    printf("%s ok\n", s);
    return 0;
}
