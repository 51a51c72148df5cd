//! The exported C symbols, only in the real library: `cargo test` and the `no-interpose`
//! feature build none of them, so test harnesses never interpose on themselves. `numpy` (the
//! NEP 49 handler) and `api` interpose on nothing and are always built.

/// An exported function that hands its own return address on (Note [Holders]): on x86-64 a
/// naked function that loads it into `$reg`, the register after its arguments, and tail-jumps to
/// `$target`, which takes it as its last parameter; elsewhere the caller is unknown (0).
#[cfg_attr(any(test, feature = "no-interpose"), allow(unused_macros))]
macro_rules! with_caller {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty, $reg:literal => $target:path) => {
        $(#[$meta])*
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        #[allow(unused_variables)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            core::arch::naked_asm!(concat!("mov ", $reg, ", qword ptr [rsp]"), "jmp {target}", target = sym $target)
        }
        $(#[$meta])*
        #[cfg(not(target_arch = "x86_64"))]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            #[allow(unused_unsafe)]
            // SAFETY: the caller's contract is the target's.
            unsafe { $target($($arg,)* crate::record::holders::Asker::UNKNOWN) }
        }
    };
}

#[cfg(not(any(test, feature = "no-interpose")))]
mod cuda_runtime;
#[cfg(not(any(test, feature = "no-interpose")))]
mod cuda_driver;
#[cfg(not(any(test, feature = "no-interpose")))]
mod cuda_captures;
#[cfg(not(any(test, feature = "no-interpose")))]
mod cuda_lookup;
#[cfg(not(any(test, feature = "no-interpose")))]
mod cxx;
#[cfg(not(any(test, feature = "no-interpose")))]
mod torch_oom;
#[cfg(all(target_arch = "x86_64", not(any(test, feature = "no-interpose"))))]
mod fast_paths;
#[cfg(not(any(test, feature = "no-interpose")))]
mod malloc;
#[cfg(not(any(test, feature = "no-interpose")))]
mod objects;
#[cfg(not(any(test, feature = "no-interpose")))]
mod page_calls;
mod api;
mod numpy;
#[cfg(not(any(test, feature = "no-interpose")))]
mod lifecycle;
