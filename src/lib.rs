//! tensormalloc: a drop-in layer under numpy, PyTorch and any C program. Small requests go on to
//! the next allocator; large ones are served by a cache of recently freed blocks (`host`); CUDA
//! device memory goes to a caching pool (`device`).
//!
//! Layers call downward only: `shim` (extern "C") -> `route` -> `state` -> `host` | `device`
//! (policy) -> `backing` traits <- `sys` (the only door to the OS). `record` (one function per
//! event) stands under the layers it records for; `report` (words and files) above the state it
//! reads. docs/architecture.md draws the same picture.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic))]

pub mod backing;
pub mod config;
pub mod device;
pub mod host;
pub mod ranges;
pub mod record;
pub mod report;
// Its callers, the malloc shims, are not built for tests and the no-interpose harnesses.
#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
mod route;
#[cfg(any(test, feature = "no-interpose"))]
pub mod sim;
pub mod state;
pub mod sys;

mod shim;
