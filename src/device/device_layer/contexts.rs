//! Which context a pool lives in, and its end (Note [Context lifetime] in device/pool/mod.rs):
//! calls made in the pool's own context (`with_device`), and a destroy, reset or last release of
//! that context forgetting the pool's blocks as the driver freed them.

use super::DeviceLayer;
use crate::backing::{DeviceError, DeviceRuntime, PrimaryContext};
use crate::device::pool::chunks::MAX_RANGES;
use crate::device::pool::DevicePool;
use crate::record;
use crate::record::holders::device_place;
use crate::sys::lock::Lock;
use core::sync::atomic::Ordering::Acquire;

/// Contexts ended so far (destroyed, reset, released for good): a handle the driver gives again
/// names a new context, which the runtime must set up again (Note [The runtime set up before we
/// serve it] in route/cuda.rs).
static CONTEXTS_ENDED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// How many contexts ended so far.
pub fn contexts_ended() -> u64 {
    CONTEXTS_ENDED.load(Acquire)
}

fn context_ended() {
    CONTEXTS_ENDED.fetch_add(1, core::sync::atomic::Ordering::AcqRel);
}

impl<R: DeviceRuntime> DeviceLayer<R> {

    /// The context `device`'s pool is bound to (Note [Context lifetime]); 0 when none.
    pub(super) fn context_of(&self, device: i32) -> u64 {
        usize::try_from(device).ok().and_then(|d| self.pools().get(d)).map_or(0, |p| p.lock().owner())
    }

    /// Note [Context lifetime]: context `ctx` was (or is about to be) destroyed: every pool
    /// whose segments live in it, and its pinned blocks, are forgotten.
    pub fn forget_context(&self, ctx: u64) {
        context_ended();
        self.captures_of_context_ended(ctx);
        for (device, pool) in self.pools().iter().enumerate() {
            if ctx != 0 {
                self.release_all_chunks(device, pool, ctx);
            }
            let mut ranges = [(0u64, 0u64); MAX_RANGES];
            let mut forgotten = 0;
            {
                let mut pool = self.lock_between_releases(device, pool);
                if ctx != 0 && pool.is_ready() && pool.owner() == ctx {
                    forgotten = pool.ranges(&mut ranges);
                    self.forget_blocks(device, &mut pool);
                }
            }
            self.unreserve(ranges.get(..forgotten).unwrap_or(&[]));
        }
        self.forget_pinned(Some(ctx));
    }

    /// `device`'s pool, locked when no idle release of it is under way (Note [Idle segments]):
    /// a context's end must not come between the background thread's check and its frees.
    pub(super) fn lock_between_releases<'a>(&self, device: usize, pool: &'a Lock<DevicePool>) -> crate::sys::lock::Guard<'a, DevicePool> {
        let Some(releasing) = self.releasing.get(device) else { return pool.lock() };
        loop {
            let guard = pool.lock();
            if releasing.load(Acquire) == 0 {
                return guard;
            }
            drop(guard);
            crate::sys::clock::pause();
        }
    }

    /// Waits until no idle release of `device`'s pool is under way (before a primary context
    /// release the driver may end it with).
    pub fn wait_for_releases(&self, device: i32) {
        if let Some(pool) = usize::try_from(device).ok().and_then(|d| self.pools().get(d).map(|p| (d, p))) {
            drop(self.lock_between_releases(pool.0, pool.1));
        }
    }

    pub(super) fn forget_blocks(&self, device: usize, pool: &mut DevicePool) {
        // Note [IPC]: handles of ours of blocks the context took with it open nothing more.
        pool.for_each_ipc_entry(crate::device::ipc::withdraw);
        pool.for_each_live(|addr, size, birth| record::forgotten(Self::block(device, addr, size, birth.holder, 0)));
        if pool.expandable() {
            let chunk = pool.chunk_bytes();
            pool.for_each_mapped_chunk(|addr, _| record::segment(device_place(device), addr, chunk, false));
        } else {
            pool.for_each_segment(|seg| record::segment(device_place(device), seg.addr, seg.blocks().map(|b| b.size).sum(), false));
        }
        pool.forget_all();
    }

    /// `device`'s primary context as the driver knows it (taken before a release of it).
    pub fn primary_context(&self, device: i32) -> PrimaryContext {
        self.runtime.primary_context(device)
    }

    /// Note [Context lifetime]: `device`'s primary context, `before` a release of it, may have
    /// reached zero references; if it is inactive now, its blocks are forgotten.
    pub fn primary_released(&self, device: i32, before: PrimaryContext) {
        if let PrimaryContext::Active(ctx) = before {
            if self.runtime.primary_context(device) == PrimaryContext::Inactive {
                self.forget_context(ctx);
            }
        }
    }

    /// Note [Context lifetime]: `device`'s primary context is being reset (cudaDeviceReset,
    /// cuDevicePrimaryCtxReset). Its pool is forgotten unless it lives in another context; when
    /// the driver cannot tell, it is forgotten anyway (a lost cache, never a dead block).
    pub fn forget_primary(&self, device: i32) {
        context_ended();
        let primary = self.runtime.primary_context(device);
        let owner = self.context_of(device);
        let owned_by_primary = match primary {
            PrimaryContext::Active(p) => owner == 0 || owner == p,
            PrimaryContext::Inactive => owner == 0,
            PrimaryContext::Unknown => true,
        };
        if owned_by_primary {
            if let Ok(d) = usize::try_from(device) {
                self.forget_pool(d);
            }
        }
        if let PrimaryContext::Active(p) = primary {
            self.captures_of_context_ended(p);
        }
        self.forget_pinned(match primary {
            PrimaryContext::Active(p) => Some(p),
            _ => None,
        });
    }

    /// After the program reset `device`'s primary context (`rc` its answer): the pool is forgotten
    /// again (another thread may have mapped a segment meanwhile) and, the reset done, a reference
    /// we retained on the context is given back.
    pub fn primary_reset_done(&self, device: i32, rc: i32) {
        self.forget_primary(device);
        if rc == 0 {
            self.runtime.primary_was_reset(device);
        }
    }

    pub(super) fn forget_pool(&self, device: usize) {
        if let Some(pool) = self.pools().get(device) {
            self.release_all_chunks(device, pool, 0);
            let mut ranges = [(0u64, 0u64); MAX_RANGES];
            let mut forgotten = 0;
            {
                let mut pool = self.lock_between_releases(device, pool);
                if pool.is_ready() {
                    forgotten = pool.ranges(&mut ranges);
                    self.forget_blocks(device, &mut pool);
                }
            }
            self.unreserve(ranges.get(..forgotten).unwrap_or(&[]));
        }
    }

    /// Runs `f` with `device` current (its pool's context, or its primary one), restoring what
    /// was current after.
    pub(super) fn with_device<T>(&self, device: i32, f: impl FnOnce() -> Result<T, DeviceError>) -> Result<T, DeviceError> {
        let owner = self.context_of(device);
        let current = self.runtime.current_device().ok();
        if current == Some(device) && (owner == 0 || self.runtime.current_context() == owner) {
            return f();
        }
        self.runtime.enter_device(device, owner)?;
        let out = f();
        self.runtime.leave_device();
        out
    }
}
