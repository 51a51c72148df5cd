/* A shared library preloaded before ours: its fallocate fails with EINTR the first
 * TM_TEST_EINTR_TIMES times it is called (3 when unset), then calls the real one. tmpfs before
 * Linux 6.10 answers so whenever a caught signal arrives during the call (a profiler's timer), and
 * this machine's kernel never does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>

static int interrupted;

int fallocate(int fd, int mode, off_t offset, off_t len) {
    const char *times = getenv("TM_TEST_EINTR_TIMES");
    if (interrupted < (times ? atoi(times) : 3)) {
        interrupted++;
        errno = EINTR;
        return -1;
    }
    int (*real)(int, int, off_t, off_t) = (int (*)(int, int, off_t, off_t))dlsym(RTLD_NEXT, "fallocate");
    return real(fd, mode, offset, len);
}
