/* The C API from a signal handler: a SIGALRM every 200 us lands in the main thread's large
 * malloc/realloc/free loop, often inside the library's own work with its lock held, and the
 * handler calls one tm_* function. The process must finish (the calls that need a lock answer
 * at once there, Note [The API inside our own work]) and the main thread's blocks and scopes
 * stay whole. Usage: api_in_handler stats|holders|trim|set-enabled|print-stats|snapshot|scope
 * [scoped]: with `scoped` the main thread opens and closes a scope of its own every turn. Beside
 * glibc alone (no tm_* symbol) the handler does nothing. Prints "MODE ok". */
#include "check.h"
#include <signal.h>
#include <sys/time.h>
#include <time.h>

static int (*get_stats)(tm_stats_t *);
static size_t (*get_holders)(void *, size_t, size_t);
static size_t (*trim)(void);
static int (*set_enabled)(int);
static void (*print_stats)(void);
static int (*snapshot)(const char *);
static int (*scope_begin)(const char *);
static int (*scope_end)(void *);

static const char *mode;
static char snapshot_path[256];
static volatile sig_atomic_t calls, answered, refused;

static void handler(int sig) {
    (void)sig;
    int saved = errno;
    calls++;
    if (!strcmp(mode, "stats") && get_stats) {
        tm_stats_t st = {.size = sizeof st};
        if (get_stats(&st) == 0) answered++; else refused++;
    } else if (!strcmp(mode, "holders") && get_holders) {
        static char rows[64 * 256];
        if (get_holders(rows, 64, 256) > 0) answered++; else refused++;
    } else if (!strcmp(mode, "trim") && trim) {
        trim();
        answered++;
    } else if (!strcmp(mode, "set-enabled") && set_enabled) {
        set_enabled(0);
        set_enabled(1);
        answered++;
    } else if (!strcmp(mode, "print-stats") && print_stats) {
        if (calls % 64 == 0) print_stats(); /* a report is long: not every tick */
        answered++;
    } else if (!strcmp(mode, "snapshot") && snapshot) {
        if (calls % 64 == 0) {
            int r = snapshot(snapshot_path);
            if (r == 0) answered++; else if (r == -EDEADLK) refused++; else { CHECK(!"snapshot failed"); }
        }
    } else if (!strcmp(mode, "scope") && scope_begin) {
        char out[256];
        if (scope_begin("handler") > 0) {
            CHECK(scope_end(out) == 0);
            answered++;
        } else {
            refused++;
        }
    }
    errno = saved;
}

int main(int argc, char **argv) {
    mode = argc > 1 ? argv[1] : "stats";
    int scoped = argc > 2 && !strcmp(argv[2], "scoped");
    snprintf(snapshot_path, sizeof snapshot_path, "/tmp/api_in_handler.%d.pickle", (int)getpid());
    get_stats = (int (*)(tm_stats_t *))dlsym(RTLD_DEFAULT, "tm_get_stats");
    get_holders = (size_t (*)(void *, size_t, size_t))dlsym(RTLD_DEFAULT, "tm_get_holders");
    trim = (size_t (*)(void))dlsym(RTLD_DEFAULT, "tm_trim");
    set_enabled = (int (*)(int))dlsym(RTLD_DEFAULT, "tm_set_enabled");
    print_stats = (void (*)(void))dlsym(RTLD_DEFAULT, "tm_print_stats");
    snapshot = (int (*)(const char *))dlsym(RTLD_DEFAULT, "tm_snapshot");
    scope_begin = (int (*)(const char *))dlsym(RTLD_DEFAULT, "tm_scope_begin");
    scope_end = (int (*)(void *))dlsym(RTLD_DEFAULT, "tm_scope_end");

    struct sigaction sa = {.sa_handler = handler, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    struct itimerval every = {.it_interval = {0, 200}, .it_value = {0, 200}};
    CHECK(setitimer(ITIMER_REAL, &every, NULL) == 0);

    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    unsigned seed = 7, turns = 0;
    char out[256];
    do {
        if (scoped && scope_begin) CHECK(scope_begin("main") == 1);
        size_t n = ((rand_r(&seed) % 7) + 1) * MB;
        unsigned char *p = malloc(n);
        CHECK(p);
        memset(p, (int)(turns & 0xff), n);
        size_t m = ((rand_r(&seed) % 7) + 1) * MB;
        p = realloc(p, m);
        CHECK(p);
        size_t kept = n < m ? n : m;
        for (size_t i = 0; i < kept; i += 4096) CHECK(p[i] == (unsigned char)(turns & 0xff));
        free(p);
        if (scoped && scope_end) {
            CHECK(scope_end(out) == 0);
            CHECK(((unsigned *)(out + 48))[0] == 1); /* the frame closed is main's, at depth 1 */
        }
        turns++;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < 1500);

    struct itimerval off = {0};
    CHECK(setitimer(ITIMER_REAL, &off, NULL) == 0);
    unlink(snapshot_path);
    char host[300];
    snprintf(host, sizeof host, "%s.host.pickle", snapshot_path);
    unlink(host);
    printf("turns %u, handler calls %d, answered %d, refused %d\n", turns, (int)calls, (int)answered, (int)refused);
    CHECK(calls > 100);
    printf("%s ok\n", mode);
    return 0;
}
