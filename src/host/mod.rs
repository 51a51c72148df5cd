//! The large-block layer: a cache of recently freed blocks (`cache`), the map of which pointers
//! are ours (`registry`), and the glue that drives them over a `PageMemory` (`layer`).

pub mod cache;
pub mod in_flight;
pub mod layer;
pub mod registry;
