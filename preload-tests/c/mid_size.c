/* Mid-size blocks in a loop (issue 38): each step is a training step's worth of requests from
 * 128 KiB (glibc's mmap threshold) to 4 MiB, through malloc, calloc, posix_memalign (PyTorch's
 * CPU allocator aligns to 64 bytes), realloc (growing and shrinking) and C++-style odd sizes:
 * every page is written, calloc'd memory and realloc'd contents are checked, malloc_usable_size
 * covers the request, and everything is freed in an order that changes every step. `mid_size [STEPS]`
 * (default 16) prints one line per step with its minor faults, then "faults: first N, most in a
 * step from the ninth on M" (the first steps settle where each block goes: four to eight, with
 * the background thread's timing) and "mid size ok". */
#include <sys/resource.h>
#include <malloc.h>
#include "check.h"

#define BLOCKS 48

static const size_t SIZES[] = {
    128 << 10, (128 << 10) + 1, 130 << 10, 192 << 10, 200 << 10, 256 << 10, (384 << 10) + 8,
    512 << 10, 700 << 10, 1 << 20, (1 << 20) + 4096, 3 << 19, 2 << 20, (3 << 20) + 100, (4 << 20) - 16,
};
#define NSIZES (sizeof SIZES / sizeof *SIZES)

static long minflt(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

static void touch(unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i += 4096) p[i] = v;
    p[n - 1] = v;
}

static int zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i += 512)
        if (p[i]) return 0;
    return p[n - 1] == 0;
}

static void step(int s) {
    unsigned char *p[BLOCKS];
    size_t n[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        n[i] = SIZES[(i * 7) % NSIZES]; /* the same requests every step, as a training loop's */
        switch (i % 4) {
        case 0:
            p[i] = malloc(n[i]);
            break;
        case 1:
            p[i] = calloc(1, n[i]);
            CHECK(p[i] && zero(p[i], n[i]));
            break;
        case 2: {
            void *q = NULL;
            CHECK(posix_memalign(&q, 64, n[i]) == 0);
            CHECK(((uintptr_t)q & 63) == 0);
            p[i] = q;
            break;
        }
        default: {
            /* Grown from a small block past the threshold, then shrunk a little. */
            unsigned char *q = malloc(1000);
            CHECK(q);
            memset(q, 0x5a, 1000);
            q = realloc(q, n[i] + 4096);
            CHECK(q && q[0] == 0x5a && q[999] == 0x5a);
            q = realloc(q, n[i]);
            CHECK(q && q[0] == 0x5a && q[999] == 0x5a);
            p[i] = q;
        }
        }
        CHECK(p[i] && malloc_usable_size(p[i]) >= n[i]);
        touch(p[i], n[i], (unsigned char)(i + s + 1));
    }
    for (int k = 0; k < BLOCKS; k++) {
        int i = (k * 5 + s) % BLOCKS; /* 5 is prime to 48: every block once */
        CHECK(p[i][0] == (unsigned char)(i + s + 1) && p[i][n[i] - 1] == (unsigned char)(i + s + 1));
        free(p[i]);
    }
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 16;
    long first = 0, most_settled = 0;
    for (int s = 0; s < steps; s++) {
        long f = minflt();
        step(s);
        f = minflt() - f;
        printf("step %d: %ld faults\n", s, f);
        if (s == 0)
            first = f;
        else if (s >= 8 && f > most_settled)
            most_settled = f;
    }
    printf("faults: first %ld, most in a step from the ninth on %ld\n", first, most_settled);
    printf("mid size ok\n");
    return 0;
}
