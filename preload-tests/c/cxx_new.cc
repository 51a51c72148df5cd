/* C++ operator new/delete in every form, alone under the preload or layered over a peer that
 * exports its own operators. `servable` (default): large `new[]` churn, std::vector growth past
 * the threshold, aligned new, large nothrow new, small news, sized and nothrow deletes, every
 * block's contents checked (the test reads the hit rate from TENSORMALLOC_STATS=json).
 * `nothrow-fail`, `throw-fail`: impossible sizes, and the next operator's new_handler;
 * `small-fail`: small news past RLIMIT_AS; `next-room`: large news that no new mapping fits under
 * RLIMIT_AS, served from the free memory the next allocator holds (as under it alone). */
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <sys/resource.h>
#include <map>
#include <new>
#include <string>
#include <vector>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            std::fprintf(stderr, "CHECK failed %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            std::exit(1);                                                            \
        }                                                                            \
    } while (0)

static const std::size_t MiB = std::size_t(1) << 20;
/* Sizes the compiler cannot see through, so it keeps every call. */
static volatile std::size_t impossible = std::size_t(1) << 50;

/* Sets RLIMIT_AS to what the process has mapped now plus `extra` bytes. */
static void limit_address_space(std::size_t extra) {
    long pages = 0;
    FILE *f = std::fopen("/proc/self/statm", "r");
    CHECK(f && std::fscanf(f, "%ld", &pages) == 1);
    std::fclose(f);
    struct rlimit rl = {std::size_t(pages) * 4096 + extra, RLIM_INFINITY};
    CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
}

/* One byte per page and the last byte: enough to catch a block handed out twice or moved
 * without its contents, cheap enough for hundreds of 64 MiB blocks. */
static void fill(char *p, std::size_t n, unsigned seed) {
    for (std::size_t i = 0; i < n; i += 4096) p[i] = char(seed + i / 4096);
    p[n - 1] = char(seed ^ 0x5a);
}

static void verify(const char *p, std::size_t n, unsigned seed) {
    for (std::size_t i = 0; i < n; i += 4096) CHECK(p[i] == char(seed + i / 4096));
    CHECK(p[n - 1] == char(seed ^ 0x5a));
}

struct alignas(4096) Page {
    char bytes[4096];
};

static int handler_calls = 0;
static void one_shot_handler() {
    handler_calls++;
    std::set_new_handler(nullptr); /* the next attempt fails and throws */
}

static void servable() {
    /* Large new[]/delete[] churn: after the first, each should be a cache hit. Two live at a
     * time, so a block handed out twice would show in the other's contents. */
    const char *churn_env = std::getenv("CXX_CHURN"); /* fewer where nothing caches: faults cost */
    const unsigned churn = churn_env ? unsigned(std::atoi(churn_env)) : 200;
    char *prev = nullptr;
    for (unsigned i = 0; i < churn; i++) {
        std::size_t n = 64 * MiB;
        char *p = new char[n];
        fill(p, n, i);
        if (prev) {
            verify(prev, n, i - 1);
            delete[] prev;
        }
        verify(p, n, i);
        prev = p;
    }
    delete[] prev;

    /* std::vector growth past the threshold: its buffers move through operator new/delete. */
    {
        std::vector<double> v;
        for (std::size_t i = 0; i < 3 * MiB; i++) v.push_back(double(i) * 0.5);
        for (std::size_t i = 0; i < v.size(); i += 777) CHECK(v[i] == double(i) * 0.5);
        CHECK(v[v.size() - 1] == double(v.size() - 1) * 0.5);
    }

    /* Aligned new, small and large; scalar aligned new with a 2 MiB alignment. */
    for (int round = 0; round < 3; round++) {
        Page *small = new Page[2];
        Page *big = new Page[2048]; /* 8 MiB */
        CHECK(reinterpret_cast<std::uintptr_t>(small) % 4096 == 0);
        CHECK(reinterpret_cast<std::uintptr_t>(big) % 4096 == 0);
        fill(big[0].bytes, 2048 * sizeof(Page), round);
        small[1].bytes[4095] = 7;
        verify(big[0].bytes, 2048 * sizeof(Page), round);
        CHECK(small[1].bytes[4095] == 7);
        delete[] small;
        delete[] big;
        void *huge_align = ::operator new(16 * MiB, std::align_val_t(2 * MiB));
        CHECK(reinterpret_cast<std::uintptr_t>(huge_align) % (2 * MiB) == 0);
        fill(static_cast<char *>(huge_align), 16 * MiB, 3);
        verify(static_cast<char *>(huge_align), 16 * MiB, 3);
        ::operator delete(huge_align, 16 * MiB, std::align_val_t(2 * MiB)); /* sized aligned */
    }

    /* Nothrow new of a large possible size: a block. */
    for (int round = 0; round < 3; round++) {
        char *q = new (std::nothrow) char[8 * MiB];
        CHECK(q != nullptr);
        fill(q, 8 * MiB, 9);
        verify(q, 8 * MiB, 9);
        ::operator delete[](q, std::nothrow);
        void *a = ::operator new(8 * MiB, std::align_val_t(8192), std::nothrow);
        CHECK(a != nullptr && reinterpret_cast<std::uintptr_t>(a) % 8192 == 0);
        ::operator delete(a, std::align_val_t(8192), std::nothrow);
    }

    /* Small news: objects, strings, a map; sized deletes on both sides of the threshold. Layered
     * over jemalloc, its per-thread counter shows they reached it. */
    typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
    mallctl_fn mallctl = reinterpret_cast<mallctl_fn>(dlsym(RTLD_DEFAULT, "mallctl"));
    std::uint64_t je_before = 0, je_after = 0;
    std::size_t len = sizeof je_before;
    if (mallctl) CHECK(mallctl("thread.allocated", &je_before, &len, nullptr, 0) == 0);
    {
        std::map<int, std::string> m;
        for (int i = 0; i < 20000; i++) m[i] = std::string(1 + i % 100, char('a' + i % 26));
        for (int i = 0; i < 20000; i += 37) CHECK(m[i].size() == std::size_t(1 + i % 100) && m[i][0] == char('a' + i % 26));
        std::vector<int *> ints;
        for (int i = 0; i < 10000; i++) ints.push_back(new int(i));
        for (int i = 0; i < 10000; i++) {
            CHECK(*ints[i] == i);
            ::operator delete(ints[i], sizeof(int)); /* sized */
        }
        void *s = ::operator new(100);
        std::memset(s, 1, 100);
        ::operator delete(s, std::nothrow);
        void *big = ::operator new(32 * MiB);
        fill(static_cast<char *>(big), 32 * MiB, 4);
        verify(static_cast<char *>(big), 32 * MiB, 4);
        ::operator delete(big, 32 * MiB); /* sized, large */
        char *arr = new char[4000];
        ::operator delete[](arr, 4000); /* sized array, small */
    }
    if (mallctl) {
        CHECK(mallctl("thread.allocated", &je_after, &len, nullptr, 0) == 0);
        CHECK(je_after - je_before >= 10000 * sizeof(int)); /* the small news */
        /* but not the large one, unless we pass everything through */
        const char *off = std::getenv("TENSORMALLOC_DISABLE");
        CHECK(je_after - je_before < 32 * MiB || (off && !std::strcmp(off, "1")));
    }
}

/* Requests no allocator can serve: nullptr from the nothrow forms. */
static void nothrow_fail() {
    CHECK(::operator new(impossible, std::nothrow) == nullptr);
    CHECK(::operator new[](impossible, std::nothrow) == nullptr);
    CHECK(::operator new(impossible, std::align_val_t(64), std::nothrow) == nullptr);
    CHECK(::operator new[](impossible, std::align_val_t(64), std::nothrow) == nullptr);
}

/* Requests no allocator can serve, throwing forms: what the next operator does (libstdc++,
 * jemalloc and tcmalloc throw std::bad_alloc; mimalloc 2.0, built as C, aborts). */
static void throw_fail() {
    /* Throwing new of an impossible size throws std::bad_alloc, plain and aligned. */
    int caught = 0;
    try {
        void *p = ::operator new(impossible);
        std::printf("not reached %p\n", p);
    } catch (const std::bad_alloc &) {
        caught++;
    }
    try {
        void *p = ::operator new[](impossible, std::align_val_t(4096));
        std::printf("not reached %p\n", p);
    } catch (const std::bad_alloc &) {
        caught++;
    }
    CHECK(caught == 2);

    /* The next operator's new_handler runs before it throws: the request reached it. */
    std::set_new_handler(one_shot_handler);
    try {
        void *p = ::operator new[](impossible);
        std::printf("not reached %p\n", p);
    } catch (const std::bad_alloc &) {
        caught++;
    }
    CHECK(caught == 3 && handler_calls == 1);
}

/* Small news until the address space runs out (RLIMIT_AS): the next operator's own loop must see
 * the failure, run the new_handler (which frees a reserve, so the retry succeeds) and, with no
 * handler left, throw std::bad_alloc. */
static char *reserve = nullptr;
static void release_reserve() {
    handler_calls++;
    delete[] reserve;
    reserve = nullptr;
    std::set_new_handler(nullptr);
}

static void small_fail() {
    std::vector<void *> keep;
    keep.reserve(1 << 20);
    reserve = new char[2 * MiB]; /* small path: glibc maps it, and unmaps it in the handler */
    std::memset(reserve, 1, 2 * MiB);
    limit_address_space(64 * MiB);
    std::set_new_handler(release_reserve);
    bool caught = false;
    try {
        while (keep.size() < keep.capacity()) keep.push_back(::operator new(1000));
    } catch (const std::bad_alloc &) {
        caught = true;
    }
    CHECK(caught && handler_calls == 1 && keep.size() < keep.capacity());
    for (void *p : keep) ::operator delete(p);
}

/* Large news under RLIMIT_AS 200 MiB over what is mapped, with 600 MiB of the next allocator's
 * heap freed (small news, deleted in reverse: glibc keeps its brk heap): every form is served
 * from that heap, as under glibc alone, with no out-of-memory report on the way (Note [Out of
 * memory behind operator new] in src/route/cxx.rs). Prints how many were served. */
static void next_room() {
    enum { PIECES = 600 * 1024, BIG = 300 };
    static void *piece[PIECES];
    static char *big[BIG];
    for (int i = 0; i < PIECES; i++) {
        piece[i] = ::operator new(1000);
        std::memset(piece[i], 1, 1000);
    }
    limit_address_space(200 * MiB);
    for (int i = PIECES - 1; i >= 0; i--) ::operator delete(piece[i]);

    int thrown = 0, nothrow = 0, aligned = 0, aligned_nothrow = 0;
    for (int i = 0; i < BIG; i++) {
        try {
            if (i % 4 == 0) {
                big[i] = new char[MiB];
                thrown++;
            } else if (i % 4 == 1) {
                big[i] = new (std::nothrow) char[MiB];
                nothrow += big[i] != nullptr;
            } else if (i % 4 == 2) {
                big[i] = static_cast<char *>(::operator new(MiB, std::align_val_t(4096)));
                aligned += reinterpret_cast<std::uintptr_t>(big[i]) % 4096 == 0;
            } else {
                big[i] = static_cast<char *>(::operator new(MiB, std::align_val_t(4096), std::nothrow));
                aligned_nothrow += big[i] != nullptr && reinterpret_cast<std::uintptr_t>(big[i]) % 4096 == 0;
            }
        } catch (const std::bad_alloc &) {
            big[i] = nullptr;
        }
        if (big[i]) fill(big[i], MiB, unsigned(i));
    }
    for (int i = 0; i < BIG; i++)
        if (big[i]) verify(big[i], MiB, unsigned(i));
    std::printf("new: %d of %d, nothrow: %d of %d, aligned: %d of %d, aligned nothrow: %d of %d\n", thrown, BIG / 4, nothrow, BIG / 4, aligned, BIG / 4, aligned_nothrow, BIG / 4);
    for (int i = 0; i < BIG; i++) {
        if (i % 4 == 0) delete[] big[i];
        else if (i % 4 == 1) delete[] big[i];
        else ::operator delete(big[i], std::align_val_t(4096));
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "servable";
    if (!std::strcmp(mode, "servable")) servable();
    else if (!std::strcmp(mode, "nothrow-fail")) nothrow_fail();
    else if (!std::strcmp(mode, "throw-fail")) throw_fail();
    else if (!std::strcmp(mode, "small-fail")) small_fail();
    else if (!std::strcmp(mode, "next-room")) next_room();
    else CHECK(!"unknown mode");
    std::printf("cxx %s ok\n", mode);
    return 0;
}
