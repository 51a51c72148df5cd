/* Small-object churn through C++ operators: one thread keeps 4096 live `new char[]` of 8 B - 4 KiB
 * and replaces random ones with `delete[]` + `new[]`, 4 million pairs (as bench-numpy's
 * small_churn.c does with free + malloc), for counting instructions under callgrind. With "hold"
 * in argv[1], one 8 MiB block stays alive throughout (under us it arms the interior check). */
#include <cstdio>
#include <cstring>

int main(int argc, char **argv) {
    const int live_n = 4096, pairs = 4000000;
    char *hold = argc > 1 && !std::strcmp(argv[1], "hold") ? new char[8u << 20] : nullptr;
    if (hold) std::memset(hold, 1, 8u << 20);
    char **live = new char *[live_n]();
    unsigned seed = 1;
    for (int i = 0; i < pairs; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 8) % live_n;
        delete[] live[k];
        live[k] = new char[8u << ((seed >> 20) % 10)]; /* 8 B .. 4 KiB */
        *(volatile char *)live[k] = 1;
    }
    for (int k = 0; k < live_n; k++) delete[] live[k];
    delete[] live;
    delete[] hold;
    std::puts("ok");
    return 0;
}
