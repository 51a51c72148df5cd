/* `span_limit N SIZE`: keeps N blocks of SIZE bytes live, every page written; run under a limit
 * on what the process may map (`ulimit -d`, `ulimit -v`). Prints "N blocks live" or the number
 * of the malloc that failed. Under a limit a huge-page block's length is not rounded to a whole
 * number of huge pages (block_shape in src/host/host_layer/mod.rs). */
#include "check.h"

int main(int argc, char **argv) {
    CHECK(argc == 3);
    int n = atoi(argv[1]);
    size_t size = strtoul(argv[2], NULL, 0);
    for (int i = 0; i < n; i++) {
        char *p = malloc(size);
        if (!p) {
            printf("malloc %d of %zu bytes failed: %s\n", i + 1, size, strerror(errno));
            return 0;
        }
        memset(p, 1, size);
    }
    printf("%d blocks live\n", n);
    return 0;
}
