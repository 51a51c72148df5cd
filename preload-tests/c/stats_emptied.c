/* The stats file emptied under a running program (`: > stats.json`, logrotate's copytruncate):
 * argv[1] is the file's path. 20 large pairs, the file truncated to nothing, 20 more pairs: the
 * program goes on (Note [Files shortened under us] in src/sys/bus_guard.rs). Then the SIGBUS the
 * program itself raises is still its own: with "handler" its handler, installed before the first
 * large request, runs for a raise(SIGBUS); with "default" the raise ends the process by SIGBUS,
 * as without us; with "resethand" its one-shot handler (SA_RESETHAND), installed first, runs once
 * for a fault of the program's own (a file it shortened under its own mapping) and the fault
 * again then ends the process by SIGBUS, as without us. Prints "emptied: ok" and, with
 * "handler", "handler ran: 1"; with "resethand", "one-shot handler" once. */
#define _GNU_SOURCE
#include "check.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile sig_atomic_t ran;

static void on_bus(int signal) {
    (void)signal;
    ran++;
}

static void one_shot(int signal) {
    (void)signal;
    static const char line[] = "one-shot handler\n";
    if (write(1, line, sizeof line - 1) < 0) _exit(3);
}

/* A fault of the program's own: a page of its own file's mapping, past the file's new end. */
static void own_fault(const char *dir_of) {
    char path[4096];
    snprintf(path, sizeof path, "%s.own", dir_of);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
    volatile char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED && ftruncate(fd, 0) == 0);
    p[0] = 1;
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
    if (!strcmp(argv[2], "resethand")) {
        struct sigaction once = {0};
        once.sa_handler = one_shot;
        once.sa_flags = SA_RESETHAND;
        CHECK(sigaction(SIGBUS, &once, NULL) == 0);
    }
    pairs(20);
    CHECK(truncate(argv[1], 0) == 0);
    pairs(20);
    printf("emptied: ok\n");
    fflush(stdout);
    if (!strcmp(argv[2], "resethand")) own_fault(argv[1]);
    raise(SIGBUS);
    printf("handler ran: %d\n", (int)ran);
    return 0;
}
