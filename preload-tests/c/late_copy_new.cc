// late_copy.c's later plugin: operator new[] as the symbol lookup finds it.
#include <cstddef>
#include <cstring>
extern "C" char *plugin_new(size_t size) {
    char *p = new char[size];
    memset(p, 3, size);
    return p;
}
