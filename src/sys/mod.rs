//! Everything that names libc: memory mapping, the next allocator, the environment, stderr,
//! locks and fork handlers, the clock. Policy code above never calls these directly.
//! Nothing here allocates through the malloc family.

pub mod clock;
pub mod cuda;
pub mod env;
pub mod lock;
pub mod memory;
pub mod next;
pub mod os_pages;
pub mod reaper;
pub mod stderr;
