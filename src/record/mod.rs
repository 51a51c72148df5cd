//! What happened to memory, recorded where it happens: counters (`stats`), per-thread scopes
//! (`scopes`), who holds each block (`holders`), the ring of recent events for the snapshot
//! (`history`) and the trace file's ring (`trace`). The layers call one function per event here
//! (events.rs); nothing here calls a layer, a route or a report.

pub mod history;
pub mod holders;
pub mod scopes;
pub mod stats;
pub mod trace;
