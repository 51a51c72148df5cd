/* late_copy.c's earlier CUDA plugin: the runtime's cudaFree, bound before the library came. */
int cudaFree(void *);
int cudaSetDevice(int);
int plugin_free(void *p) { return cudaSetDevice(0) ? -1 : cudaFree(p); }
