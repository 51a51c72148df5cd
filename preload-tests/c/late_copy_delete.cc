// late_copy.c's earlier plugin: libstdc++'s operator delete[].
extern "C" void plugin_delete(char *p) { delete[] p; }
