//! The only door to the OS: every libc call of the crate is made here (memory mapping, the next
//! allocator, dlsym and the CUDA symbols, the environment, stderr and output files, errno,
//! locks and fork handlers, the clock). Code above may name C types, never call libc.
//! Nothing here allocates through the malloc family.

pub mod bind;
pub mod bus_guard;
pub mod caller;
pub mod cancel;
pub mod claim;
pub mod clock;
pub mod cuda_runtime;
pub mod cuda_backing;
pub mod cuda_driver;
pub mod cuda_shareable;
// Its user, tensormalloc.torch's raising allocation function, is not built for tests and the no-interpose harnesses.
#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
pub mod cxx_throw;
pub mod dir;
pub mod dlsym;
pub mod find_object;
pub mod env;
pub mod files;
pub mod fork_mark;
pub mod front;
pub mod kept;
pub mod lock;
pub mod mapped_on_use;
pub mod memory;
pub mod next;
// Its users, the operator new shims, are not built for tests and the no-interpose harnesses.
#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
pub mod next_cxx;
pub mod os_pages;
pub mod page_calls;
pub mod process;
pub mod reaper;
pub mod reentry;
pub mod shared_memory;
pub mod stack;
pub mod stack_switch;
pub mod stderr;
pub mod stdio;
pub mod thread;
pub mod unix_socket;
pub mod unmap_later;
