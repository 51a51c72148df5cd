/* A program whose main thread ends by itself while our background thread runs: glibc ends the
 * process with its last thread. `last_thread HOW`: 64 MiB blocks are written and one freed (our
 * thread starts), then the main thread
 *   pthread_exit: registers an exit handler, writes "main left" into stdout's buffer and calls
 *                 pthread_exit (glibc then runs exit(0): the handler runs and the buffer is
 *                 flushed);
 *   deep-handler: the same with a handler that uses 1 MiB of stack (it runs on the last thread);
 *   raw-exit:     leaves by the exit system call;
 *   strict:       enters seccomp's strict mode, frees a small block and leaves by the exit system
 *                 call (the only way out there).
 * Writes "threads N" (the kernel's count before leaving) to stderr. The test's timeout says
 * whether the process ended. */
#define _GNU_SOURCE
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static void handler(void) {
    static const char text[] = "exit handler ran\n";
    write(1, text, sizeof text - 1);
}

static void deep_handler(void) {
    volatile char buf[1 << 20];
    for (size_t i = 0; i < sizeof buf; i += 512) buf[i] = (char)i;
    (void)buf[512];
    handler();
}

static long threads(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long n = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "Threads:", 8) == 0) n = atol(line + 8);
    if (f) fclose(f);
    return n;
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "pthread_exit";
    size_t size = 64 << 20;
    char *a = malloc(size), *b = malloc(size);
    if (!a || !b) return 2;
    memset(a, 1, size);
    memset(b, 2, size);
    free(b);
    usleep(100 * 1000);
    char *small = malloc(100);
    fprintf(stderr, "threads %ld\n", threads());
    if (strcmp(how, "pthread_exit") == 0 || strcmp(how, "deep-handler") == 0) {
        atexit(strcmp(how, "pthread_exit") == 0 ? handler : deep_handler);
        printf("main left\n"); /* a pipe: stays in the buffer until exit flushes it */
        pthread_exit(NULL);
    }
    if (strcmp(how, "strict") == 0) {
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) return 3;
        free(small);
        write(1, "strict left\n", 12);
    } else {
        write(1, "raw left\n", 9);
    }
    syscall(SYS_exit, 0);
    return 4;
}
