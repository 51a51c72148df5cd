//! Graph captures' begins and ends (`shim::cuda_captures`' entry points, one call each): passed
//! to the driver unchanged, and counted for the device layer, which makes no driver call of its
//! own while one is under way (Note [Graph captures under way] in
//! device/device_layer/captures.rs).

use crate::backing::CUDA_ERROR_INITIALIZATION;
use crate::sys::cuda_driver::{driver, DriverFns};
use crate::state::DEVICE;
use core::ffi::{c_int, c_void};

/// A begin of any spelling: `spelling` picks the driver's function, `call` makes the call.
///
/// # Safety
/// `call` makes the driver's call with the caller's arguments, under the driver's contract.
pub unsafe fn begin<F>(stream: *mut c_void, spelling: fn(&DriverFns) -> Option<F>, call: impl FnOnce(F) -> c_int) -> c_int {
    let Some(real) = driver().and_then(spelling) else { return CUDA_ERROR_INITIALIZATION };
    DEVICE.before_capture();
    DEVICE.capture_beginning();
    let rc = call(real);
    DEVICE.capture_begin_answered(rc, stream as u64);
    rc
}

/// # Safety
/// As cuStreamEndCapture(_ptsz).
pub unsafe fn end(stream: *mut c_void, graph: *mut *mut c_void, spelling: fn(&DriverFns) -> Option<crate::sys::cuda_driver::EndCaptureFn>) -> c_int {
    let Some(real) = driver().and_then(spelling) else { return CUDA_ERROR_INITIALIZATION };
    let rc = real(stream, graph);
    DEVICE.capture_end_answered(rc, stream as u64);
    rc
}
