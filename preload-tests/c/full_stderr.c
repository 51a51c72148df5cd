/* stderr is a one-page pipe nobody reads while the program runs: it makes large requests, fills
 * all but 100 bytes of the pipe, and exits; with "own" it then writes 200 bytes of its own, which
 * block there as our exit report does (Note: a wait for room lets the program's signals in, in
 * src/report/stats_file.rs). Prints "exiting" on stdout first. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (fcntl(2, F_SETPIPE_SZ, 4096) < 0) return 2;
    for (int i = 0; i < 20; i++) {
        char *volatile p = malloc(8 << 20);
        p[0] = 1;
        free(p);
    }
    char fill[3996];
    memset(fill, 'x', sizeof fill);
    if (write(2, fill, sizeof fill) != (ssize_t)sizeof fill) return 3;
    printf("exiting\n");
    fflush(stdout);
    if (argc > 1 && !strcmp(argv[1], "own")) {
        char more[200];
        memset(more, 'y', sizeof more);
        if (write(2, more, sizeof more) < 0) return 4;
    }
    return 0;
}
