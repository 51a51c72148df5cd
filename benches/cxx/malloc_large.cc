/* C++ large-block churn after mimalloc-bench's malloc-large: 20 slots, each iteration replaces a
 * random slot with a value-initialized (zeroed) `new char[]` of 5-25 MB, so about 300 MB stay
 * live. Prints one line: "ms FAULTS" (the loop's wall time and its minor faults). */
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sys/resource.h>

static long minor_faults() {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

int main(int argc, char **argv) {
    const int iterations = argc > 1 ? std::atoi(argv[1]) : 500;
    const int buffers_n = 20;
    const std::size_t min_size = 5 << 20, max_size = 25 << 20;
    std::unique_ptr<char[]> buffers[buffers_n];
    std::mt19937 gen(42);
    std::uniform_int_distribution<std::size_t> size_dist(min_size, max_size);
    std::uniform_int_distribution<int> slot_dist(0, buffers_n - 1);
    long faults0 = minor_faults();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; i++) {
        int slot = slot_dist(gen);
        std::size_t size = size_dist(gen);
        buffers[slot] = std::make_unique<char[]>(size);
        buffers[slot][size - 1] = char(i);
    }
    for (auto &b : buffers) b.reset();
    auto t1 = std::chrono::steady_clock::now();
    std::printf("%.1f %ld\n", std::chrono::duration<double, std::milli>(t1 - t0).count(), minor_faults() - faults0);
    return 0;
}
