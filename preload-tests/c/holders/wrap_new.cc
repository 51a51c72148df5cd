// A C++ library whose factory ends in a tail call to operator new[] at -O2.
#include <cstddef>

extern "C" char *make(std::size_t n) {
    return new char[n];
}
