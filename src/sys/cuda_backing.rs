//! The pool's device backing over the program's CUDA driver: `CudaDriver`, a `DeviceRuntime`
//! made of the real entry points (sys/cuda_driver.rs), so the pool works under any runtime,
//! shared, static or none; the virtual memory API's shareable handles through
//! sys/cuda_shareable.rs. Every answer we cannot get is an error the policy handles.

use super::cuda_driver::{allocation_range, check, current_context, device_memory, driver, get, primary_context, set_access, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED};
use crate::backing::{DeviceError, DeviceRuntime, PrimaryContext};
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicU64, Ordering};

/// Primary contexts the pool retained to enter a device with none of its own (held for the
/// process's life, as the runtime holds its own, or until the program resets the device).
static RETAINED_PRIMARY: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];

fn retained_primary(device: i32) -> Result<u64, DeviceError> {
    let slot = usize::try_from(device).ok().and_then(|d| RETAINED_PRIMARY.get(d)).ok_or(DeviceError::Other(101))?;
    let held = slot.load(Ordering::Acquire);
    if held != 0 {
        return Ok(held);
    }
    let retain = get(|d| d.primary_retain)?;
    let mut dev: c_int = device;
    if let Ok(device_get) = get(|d| d.device_get) {
        // SAFETY: writes one int.
        check(unsafe { device_get(&mut dev, device) })?;
    }
    let mut ctx: *mut c_void = core::ptr::null_mut();
    // SAFETY: writes one pointer; the reference is kept for good.
    check(unsafe { retain(&mut ctx, dev) })?;
    if slot.compare_exchange(0, ctx as u64, Ordering::AcqRel, Ordering::Acquire).is_err() {
        if let Ok(release) = get(|d| d.primary_release) {
            // SAFETY: drops the reference this thread took; another thread's is kept.
            unsafe { release(dev) };
        }
    }
    Ok(slot.load(Ordering::Acquire))
}

/// `DeviceRuntime` over the real driver.
pub struct CudaDriver;

impl DeviceRuntime for CudaDriver {
    fn current_device(&self) -> Result<i32, DeviceError> {
        let f = get(|d| d.ctx_get_device)?;
        let mut device: c_int = 0;
        // SAFETY: writes one int; fails when no context is current.
        check(unsafe { f(&mut device) })?;
        Ok(device)
    }
    fn enter_device(&self, device: i32, ctx: u64) -> Result<(), DeviceError> {
        let push = get(|d| d.ctx_push)?;
        let ctx = if ctx != 0 { ctx } else { retained_primary(device)? };
        // SAFETY: a context handle the driver gave us; popped by leave_device.
        check(unsafe { push(ctx as *mut c_void) })
    }
    fn enter_context(&self, ctx: u64) -> Result<(), DeviceError> {
        let push = get(|d| d.ctx_push)?;
        // SAFETY: a context handle the driver gave us; popped by leave_device.
        check(unsafe { push(ctx as *mut c_void) })
    }
    fn leave_device(&self) {
        if let Ok(pop) = get(|d| d.ctx_pop) {
            let mut ctx: *mut c_void = core::ptr::null_mut();
            // SAFETY: pops what enter_device pushed.
            unsafe { pop(&mut ctx) };
        }
    }
    fn malloc(&self, len: usize) -> Result<usize, DeviceError> {
        let f = get(|d| d.mem_alloc)?;
        let mut p = 0u64;
        // SAFETY: writes one CUdeviceptr.
        check(unsafe { f(&mut p, len) })?;
        Ok(p as usize)
    }
    fn free(&self, addr: usize) -> Result<(), DeviceError> {
        let f = get(|d| d.mem_free)?;
        // SAFETY: addr came from the driver's cuMemAlloc.
        check(unsafe { f(addr as u64) })
    }
    fn synchronize(&self) -> Result<(), DeviceError> {
        let f = get(|d| d.ctx_synchronize)?;
        // SAFETY: plain call.
        check(unsafe { f() })
    }
    fn exchange_capture_mode(&self, mode: i32) -> Option<i32> {
        let f = get(|d| d.exchange_capture_mode).ok()?;
        let mut mode: c_int = mode;
        // SAFETY: reads and writes one int, the calling thread's setting.
        (unsafe { f(&mut mode) } == 0).then_some(mode)
    }
    fn mem_info(&self) -> Result<(usize, usize), DeviceError> {
        let f = get(|d| d.mem_get_info)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        check(unsafe { f(&mut free, &mut total) })?;
        Ok((free, total))
    }
    fn host_alloc(&self, len: usize, flags: u32) -> Result<usize, DeviceError> {
        let f = get(|d| d.mem_host_alloc)?;
        let mut p: *mut c_void = core::ptr::null_mut();
        // SAFETY: writes one pointer.
        check(unsafe { f(&mut p, len, flags) })?;
        Ok(p as usize)
    }
    fn host_free(&self, addr: usize) -> Result<(), DeviceError> {
        let f = get(|d| d.mem_free_host)?;
        // SAFETY: addr came from the driver's cuMemHostAlloc.
        check(unsafe { f(addr as *mut c_void) })
    }
    fn clear_last_error(&self) {
        // The driver keeps no last error; the runtime never saw our calls.
    }
    fn current_context(&self) -> u64 {
        current_context()
    }
    fn primary_was_reset(&self, device: i32) {
        let Some(slot) = usize::try_from(device).ok().and_then(|d| RETAINED_PRIMARY.get(d)) else { return };
        if slot.swap(0, Ordering::AcqRel) == 0 {
            return;
        }
        let mut dev: c_int = device;
        if let Ok(device_get) = get(|d| d.device_get) {
            // SAFETY: writes one int.
            unsafe { device_get(&mut dev, device) };
        }
        if let Ok(release) = get(|d| d.primary_release) {
            // SAFETY: gives back the reference retained_primary took.
            unsafe { release(dev) };
        }
    }
    fn primary_context(&self, device: i32) -> PrimaryContext {
        match primary_context(device) {
            Some(Some(ctx)) => PrimaryContext::Active(ctx),
            Some(None) => PrimaryContext::Inactive,
            None => PrimaryContext::Unknown,
        }
    }
    fn allocation_range(&self, addr: usize) -> Option<(usize, usize)> {
        allocation_range(addr)
    }
    fn granularity(&self, device: i32) -> Option<u64> {
        let d = driver()?;
        let (get, attribute, granularity) = (d.device_get?, d.device_get_attribute?, d.mem_get_granularity?);
        d.mem_create.and(d.mem_address_reserve).and(d.mem_map).and(d.mem_set_access).and(d.mem_unmap).and(d.mem_release)?;
        let (mut handle, mut supported, mut bytes): (c_int, c_int, usize) = (0, 0, 0);
        let prop = device_memory(device);
        // SAFETY: each call writes one value of its documented type; prop lives across the call.
        let ok = unsafe { get(&mut handle, device) == 0 && attribute(&mut supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, handle) == 0 && supported != 0 && granularity(&mut bytes, &prop, 0) == 0 };
        if ok {
            // Note [IPC of expandable segments]: whether its chunks can be made exportable.
            super::cuda_shareable::learn(device, attribute, handle);
        }
        (ok && (bytes as u64).is_power_of_two()).then_some(bytes as u64)
    }
    fn reserve(&self, len: u64) -> Result<u64, DeviceError> {
        let f = get(|d| d.mem_address_reserve)?;
        let mut addr = 0u64;
        // SAFETY: writes one CUdeviceptr.
        check(unsafe { f(&mut addr, len as usize, 0, 0, 0) })?;
        Ok(addr)
    }
    fn map_chunk(&self, device: i32, addr: u64, len: u64, peers: u64) -> Result<u64, DeviceError> {
        let (map, unmap, release) = (get(|d| d.mem_map)?, get(|d| d.mem_unmap)?, get(|d| d.mem_release)?);
        let handle = super::cuda_shareable::create(device, len)?;
        // SAFETY: the documented calls, on a handle we created and a range we reserved; each
        // failure undoes what came before.
        unsafe {
            if let Err(e) = check(map(addr, len as usize, 0, handle, 0)) {
                release(handle);
                return Err(e);
            }
            if let Err(e) = set_access(addr, len, device, peers) {
                unmap(addr, len as usize);
                release(handle);
                return Err(e);
            }
        }
        Ok(handle)
    }
    fn grant_access(&self, addr: u64, len: u64, device: i32) -> Result<(), DeviceError> {
        set_access(addr, len, device, 0)
    }
    fn unreserve(&self, addr: u64, len: u64) -> Result<(), DeviceError> {
        let f = get(|d| d.mem_address_free)?;
        // SAFETY: a range cuMemAddressReserve gave us, with nothing of ours mapped in it.
        check(unsafe { f(addr, len as usize) })
    }
    fn move_chunk(&self, device: i32, from: u64, to: u64, len: u64, handle: u64, peers: u64) -> Result<(), DeviceError> {
        let (map, unmap, release) = (get(|d| d.mem_map)?, get(|d| d.mem_unmap)?, get(|d| d.mem_release)?);
        // SAFETY: the documented calls on a handle we created, mapped by us at `from`, and a
        // range we reserved at `to`; a failure releases the handle.
        unsafe {
            check(unmap(from, len as usize))?;
            let moved = check(map(to, len as usize, 0, handle, 0)).and_then(|()| {
                set_access(to, len, device, peers).inspect_err(|_| {
                    unmap(to, len as usize);
                })
            });
            if moved.is_err() {
                release(handle);
            }
            moved
        }
    }
    fn ipc_handle(&self, base: u64) -> Result<[u8; 64], DeviceError> {
        let f = get(|d| d.ipc_get_mem_handle)?;
        let mut handle = [0u8; 64];
        // SAFETY: writes one CUipcMemHandle (64 bytes) into our buffer.
        check(unsafe { f(handle.as_mut_ptr().cast(), base) })?;
        Ok(handle)
    }
    fn export_chunk(&self, handle: u64) -> Result<i32, DeviceError> {
        super::cuda_shareable::export(handle)
    }
    fn close_exported(&self, fd: i32) {
        let _ = super::files::close(fd);
    }
    fn dup_exported(&self, fd: i32) -> Option<i32> {
        super::unix_socket::dup(fd)
    }
    fn unmap_chunk(&self, addr: u64, len: u64, handle: u64) -> Result<(), DeviceError> {
        let (unmap, release) = (get(|d| d.mem_unmap)?, get(|d| d.mem_release)?);
        // SAFETY: a chunk we mapped with a handle we created.
        check(unsafe { unmap(addr, len as usize) })?;
        // SAFETY: as above; the mapping went, so the memory goes back.
        check(unsafe { release(handle) })
    }
}
