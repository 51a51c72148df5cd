//! The large-block layer: a cache of recently freed blocks (`cache`), the map of which pointers
//! are ours (`registry`), and the glue that drives them over a `PageMemory` (`host_layer`).

pub mod cache;
pub mod host_layer;
pub mod registry;
pub mod tally;
