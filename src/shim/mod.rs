//! The exported C symbols, only in the real library: `cargo test` and the `no-interpose`
//! feature build none of them, so test harnesses never interpose on themselves. `numpy` (the
//! NEP 49 handler) and `api` interpose on nothing and are always built.

#[cfg(not(any(test, feature = "no-interpose")))]
mod cuda;
#[cfg(not(any(test, feature = "no-interpose")))]
mod cuda_driver;
#[cfg(not(any(test, feature = "no-interpose")))]
mod lookup;
#[cfg(not(any(test, feature = "no-interpose")))]
mod cxx;
#[cfg(all(target_arch = "x86_64", not(any(test, feature = "no-interpose"))))]
mod fast_paths;
#[cfg(not(any(test, feature = "no-interpose")))]
mod malloc;
mod api;
mod numpy;
