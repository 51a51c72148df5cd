/* calloc_churn_threads THREADS ROUNDS: each thread, ROUNDS times, asks for a 1-8 MiB block, by
 * calloc or malloc, and uses it: a calloc'd one read only, written half or whole, a malloc'd
 * one written whole; then swaps it into a table the threads share and frees what it took out,
 * so blocks change hands. Every calloc must read zero where it is read. Prints "faults N": the
 * process's minor faults. Note [calloc costs what is touched] in src/host/host_layer/alloc.rs. */
#include "check.h"
#include <pthread.h>

#define TABLE 64
static void *table[TABLE];
static int rounds;

static void *churn(void *arg) {
    unsigned s = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    for (int i = 0; i < rounds; i++) {
        s = s * 1103515245u + 12345u;
        size_t len = (size_t)(1 + (s >> 8) % 8) * MB;
        int kind = (s >> 4) % 4; /* 0: calloc, read; 1: calloc, written; 2: malloc, written; 3: calloc, half written */
        char *p = kind == 2 ? malloc(len) : calloc(1, len);
        CHECK(p);
        if (kind != 2) {
            for (size_t at = 0; at < len; at += 4096) CHECK(((volatile char *)p)[at] == 0);
        }
        if (kind != 0) memset(p, 0x5a, kind == 3 ? len / 2 : len);
        free(__atomic_exchange_n(&table[(s >> 12) % TABLE], p, __ATOMIC_ACQ_REL));
    }
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    int threads = atoi(argv[1]);
    rounds = atoi(argv[2]);
    pthread_t t[256];
    CHECK(threads > 0 && threads <= 256);
    for (int i = 0; i < threads; i++) CHECK(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)i) == 0);
    for (int i = 0; i < threads; i++) CHECK(pthread_join(t[i], NULL) == 0);
    for (int i = 0; i < TABLE; i++) free(table[i]);
    struct rusage u;
    CHECK(getrusage(RUSAGE_SELF, &u) == 0);
    printf("faults %ld\n", u.ru_minflt);
    return 0;
}
