// Two plugins a C program loads one after the other (c/cxx_runtime_late_main.c). Built with
// -DSTATIC_RUNTIME -static-libstdc++: C++ with its own copy of the runtime, whose operators it
// exports (the first new reaches a process with no shared C++ runtime). Built plainly: on the
// shared libstdc++, an impossible new that must run the new_handler, then throw std::bad_alloc.
#include <cstdio>
#include <new>
#include <vector>

#ifdef STATIC_RUNTIME
extern "C" int plugin_work() {
    std::vector<int> v(1000, 1);
    int *p = new int[10];
    delete[] p;
    return (int)v.size();
}
#else
static int calls = 0;
static void handler() {
    calls++;
    std::set_new_handler(nullptr);
}

extern "C" int plugin_work() {
    std::set_new_handler(handler);
    try {
        volatile size_t n = size_t(1) << 46;
        char *p = new char[n];
        std::printf("got %p\n", static_cast<void *>(p));
    } catch (std::bad_alloc &) {
        std::printf("bad_alloc, handler calls %d\n", calls);
    }
    try {
        volatile size_t n = size_t(1) << 46;
        void *p = operator new(n);
        std::printf("got %p\n", p);
    } catch (std::bad_alloc &) {
        std::printf("bad_alloc again\n");
    }
    return 0;
}
#endif
