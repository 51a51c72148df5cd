/* The stats file emptied under a running program (`: > stats.json`, logrotate's copytruncate):
 * argv[1] is the file's path. 20 large pairs, the file truncated to nothing, 20 more pairs: the
 * program goes on (Note [Files shortened under us] in src/sys/bus_guard.rs). Then the SIGBUS the
 * program itself raises is still its own: with "handler" its handler, installed before the first
 * large request, runs for a raise(SIGBUS); with "default" the raise ends the process by SIGBUS,
 * as without us. Prints "emptied: ok" and, with "handler", "handler ran: 1". */
#define _GNU_SOURCE
#include "check.h"
#include <signal.h>
#include <unistd.h>

static volatile sig_atomic_t ran;

static void on_bus(int signal) {
    (void)signal;
    ran++;
}

static void pairs(int n) {
    for (int i = 0; i < n; i++) {
        char *p = malloc(8 * MB);
        CHECK(p);
        memset(p, i, 8 * MB);
        free(p);
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    if (!strcmp(argv[2], "handler")) CHECK(signal(SIGBUS, on_bus) != SIG_ERR);
    pairs(20);
    CHECK(truncate(argv[1], 0) == 0);
    pairs(20);
    printf("emptied: ok\n");
    fflush(stdout);
    raise(SIGBUS);
    printf("handler ran: %d\n", (int)ran);
    return 0;
}
