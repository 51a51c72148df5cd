//! Everything that names libc: memory mapping, the next allocator, the environment, stderr,
//! locks and fork handlers, the clock. Policy code above never calls these directly.
//! Nothing here allocates through the malloc family.

pub mod bind;
pub mod caller;
pub mod clock;
pub mod cuda_runtime;
pub mod cuda_driver;
pub mod dlsym;
pub mod env;
pub mod lock;
pub mod memory;
pub mod next;
// Its users, the operator new shims, are not built for tests and the no-interpose harnesses.
#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
pub mod next_cxx;
pub mod os_pages;
pub mod reaper;
pub mod reentry;
pub mod stderr;
