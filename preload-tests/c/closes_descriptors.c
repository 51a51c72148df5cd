/* A daemon's descriptor hygiene with files of ours open (Note [Descriptors the program may close]
 * in src/sys/kept.rs): after some large blocks (our trace or stats file is then open), close
 * every descriptor past stderr, then open DIR (a directory, `dirs`) or FILE (a data file holding
 * "DATA", `files`) again and again until every number up to 1100 is the program's, so that
 * whatever numbers ours had now name the program's files. More large blocks follow, then exit.
 * Nothing of ours may be written into FILE or named in DIR.
 * Usage: closes_descriptors dirs|files DIR FILE */
#define _GNU_SOURCE
#include "check.h"
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

static void churn(void) {
    for (int i = 0; i < 200; i++) {
        char *p = malloc(8 * MB);
        CHECK(p);
        p[0] = (char)i;
        free(p);
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 4);
    int dirs = strcmp(argv[1], "dirs") == 0;
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < 1200 && rl.rlim_max >= 1200) {
        rl.rlim_cur = 1200;
        CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
    int data = open(argv[3], O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(data >= 0 && write(data, "DATA", 4) == 4);
    close(data);
    churn();
    for (int fd = 3; fd < 4096; fd++) close(fd);
    int last = -1;
    while (last < 1100) {
        int fd = dirs ? open(argv[2], O_RDONLY | O_DIRECTORY) : open(argv[3], O_RDWR);
        if (fd < 0) break;
        last = fd;
    }
    churn();
    printf("filled up to %d\n", last);
    return 0;
}
