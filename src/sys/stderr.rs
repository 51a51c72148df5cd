//! Writing to stderr without allocating: a fixed stack buffer that implements `fmt::Write`
//! (core's formatting never allocates) and is flushed with write(2).

use core::fmt;

/// A line buffer on the stack; text past its capacity is cut, never allocated.
pub struct StackWriter<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackWriter<N> {
    pub const fn new() -> Self {
        StackWriter { buf: [0; N], len: 0 }
    }

    /// Empties it, in place (a static one is reused without a copy on the stack).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }

    /// Writes what was gathered to a file descriptor, retrying short writes and EINTR.
    pub fn flush_to(&mut self, fd: i32) {
        write_all(fd, self.as_bytes());
        self.len = 0;
    }
}

impl<const N: usize> Default for StackWriter<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> fmt::Write for StackWriter<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = N.saturating_sub(self.len);
        let take = s.len().min(room);
        if let (Some(dst), Some(src)) = (self.buf.get_mut(self.len..self.len + take), s.as_bytes().get(..take)) {
            dst.copy_from_slice(src);
            self.len += take;
        }
        Ok(())
    }
}

/// write(2) all of `bytes`, giving up quietly on a real error: diagnostics must never fail the host.
pub fn write_all(fd: i32, bytes: &[u8]) {
    let _ = super::files::write_all(fd, bytes);
}

/// Writes one formatted line to stderr, prefixed with "tensormalloc: ", in a single write(2).
#[macro_export]
macro_rules! warn_line {
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
        let mut w = $crate::sys::stderr::StackWriter::<512>::new();
        let _ = w.write_str("tensormalloc: ");
        let _ = write!(w, $($arg)*);
        let _ = w.write_str("\n");
        w.flush_to(2);
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    #[test]
    fn cuts_instead_of_growing() {
        let mut w = StackWriter::<8>::new();
        w.write_str("0123456789").unwrap();
        assert_eq!(w.as_bytes(), b"01234567");
    }
}
