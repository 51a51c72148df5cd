//! The large-block layer: a cache of recently freed blocks (`cache`), beside it the block each
//! thread freed last, kept for its next request (`thread_slots`), the map of which pointers are
//! ours (`registry`), and the glue that drives them over a `PageMemory` (`host_layer`).

pub mod cache;
pub mod host_layer;
pub mod registry;
pub mod tally;
pub mod thread_slots;
