//! Pinned memory: host memory the runtime page-locks for the device (cudaHostAlloc,
//! cudaMallocHost, cuMemHostAlloc). `cache` keeps freed pinned blocks for reuse (pure policy over
//! fixed tables); `serve` is the device layer's entry points that drive it over the runtime.

pub mod cache;
mod serve;
