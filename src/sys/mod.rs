//! Everything that names libc: memory mapping, the next allocator, the environment, stderr,
//! locks and fork handlers, the clock. Policy code above never calls these directly.
//! Nothing here allocates through the malloc family.

pub mod clock;
pub mod cuda;
pub mod cuda_driver;
pub mod dlsym;
pub mod env;
pub mod lock;
pub mod next;
pub mod os_pages;
pub mod reaper;
pub mod reentry;
pub mod stderr;
