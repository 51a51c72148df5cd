//! A streaming pickle writer: the few protocol 2 opcodes a tree of dicts, lists, ints and
//! strings needs, written as they come through a fixed buffer to a file descriptor, with no
//! allocation (the snapshot writes it at exit and from `tm_snapshot`). Python's `pickle` and the
//! JavaScript reader of pytorch.org/memory_viz both read every opcode used here.

use core::ffi::c_int;

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const MARK: u8 = b'(';
const SETITEMS: u8 = b'u';
const APPENDS: u8 = b'e';
const TUPLE: u8 = b't';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';
const BINPUT: u8 = b'q';
const BINGET: u8 = b'h';
const LONG_BINPUT: u8 = b'r';
const LONG_BINGET: u8 = b'j';

/// Where pickled bytes go.
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

/// A buffer of N bytes on the stack, written to `fd` with write(2) whenever it fills. After a
/// failed write it drops everything and remembers the errno (`finish` reports it).
pub struct FdSink<const N: usize> {
    fd: c_int,
    buf: [u8; N],
    len: usize,
    error: c_int,
}

impl<const N: usize> FdSink<N> {
    pub const fn new(fd: c_int) -> Self {
        FdSink { fd, buf: [0; N], len: 0, error: 0 }
    }

    fn flush(&mut self) {
        let pending = self.buf.get(..self.len).unwrap_or(&[]);
        if self.error == 0 {
            if let Err(e) = crate::sys::files::write_all(self.fd, pending) {
                self.error = e;
            }
        }
        self.len = 0;
    }

    /// Writes what is buffered; the errno of the first failed write, if any.
    pub fn finish(&mut self) -> Result<(), c_int> {
        self.flush();
        if self.error == 0 {
            Ok(())
        } else {
            Err(self.error)
        }
    }
}

impl<const N: usize> Sink for FdSink<N> {
    fn put(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.error == 0 {
            if self.len == N {
                self.flush();
            }
            let take = bytes.len().min(N - self.len);
            if let (Some(dst), Some(src)) = (self.buf.get_mut(self.len..self.len + take), bytes.get(..take)) {
                dst.copy_from_slice(src);
            }
            self.len += take;
            bytes = bytes.get(take..).unwrap_or(&[]);
        }
    }
}

#[cfg(test)]
impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// The memo slots that `memo_str` may use (BINPUT's one-byte index); `memo_get_long` and
/// `memo_put_long` take indices from 256 up, for the caller's own objects.
pub const SHORT_MEMO: usize = 256;

/// Writes opcodes. Containers are built the way Python's pickler builds them: an empty dict or
/// list, a MARK, the items, then SETITEMS or APPENDS (the caller pairs them).
pub struct Pickler<S: Sink> {
    pub sink: S,
    memoized: [u64; SHORT_MEMO / 64],
}

impl<S: Sink> Pickler<S> {
    pub const fn new(sink: S) -> Self {
        Pickler { sink, memoized: [0; SHORT_MEMO / 64] }
    }

    fn op(&mut self, code: u8) {
        self.sink.put(&[code]);
    }

    fn op_with(&mut self, code: u8, arg: &[u8]) {
        self.sink.put(&[code]);
        self.sink.put(arg);
    }

    /// The header: protocol 2.
    pub fn proto(&mut self) {
        self.op_with(PROTO, &[2]);
    }

    pub fn stop(&mut self) {
        self.op(STOP);
    }

    pub fn empty_dict(&mut self) {
        self.op(EMPTY_DICT);
    }

    pub fn empty_list(&mut self) {
        self.op(EMPTY_LIST);
    }

    pub fn mark(&mut self) {
        self.op(MARK);
    }

    /// Ends a dict's items (key, value pairs pushed since the MARK).
    pub fn setitems(&mut self) {
        self.op(SETITEMS);
    }

    /// Ends a list's items (pushed since the MARK).
    pub fn appends(&mut self) {
        self.op(APPENDS);
    }

    /// A tuple of the items pushed since the MARK.
    pub fn tuple(&mut self) {
        self.op(TUPLE);
    }

    pub fn none(&mut self) {
        self.op(NONE);
    }

    pub fn bool(&mut self, v: bool) {
        self.op(if v { NEWTRUE } else { NEWFALSE });
    }

    /// A non-negative int, in the shortest form Python's pickler would use.
    pub fn uint(&mut self, v: u64) {
        if v <= 0xff {
            self.op_with(BININT1, &[v as u8]);
        } else if v <= 0xffff {
            self.op_with(BININT2, &(v as u16).to_le_bytes());
        } else if v <= 0x7fff_ffff {
            self.op_with(BININT, &(v as u32).to_le_bytes());
        } else {
            // Two's complement, little-endian, as few bytes as keep the sign bit clear.
            let bytes = v.to_le_bytes();
            let used = 8 - (v.leading_zeros() / 8) as usize;
            let top_set = bytes.get(used.saturating_sub(1)).is_some_and(|b| b & 0x80 != 0);
            let n = used + usize::from(top_set);
            let mut arg = [0u8; 10];
            if let Some(a) = arg.get_mut(0) {
                *a = n as u8;
            }
            if let (Some(dst), Some(src)) = (arg.get_mut(1..1 + used), bytes.get(..used)) {
                dst.copy_from_slice(src);
            }
            self.op_with(LONG1, arg.get(..1 + n).unwrap_or(&[]));
        }
    }

    /// A str from bytes that should be UTF-8 (paths and symbol names from the loader): each
    /// invalid sequence becomes U+FFFD, so every reader can decode it.
    pub fn str(&mut self, bytes: &[u8]) {
        let len: usize = bytes.utf8_chunks().map(|c| c.valid().len() + if c.invalid().is_empty() { 0 } else { 3 }).sum();
        self.op_with(BINUNICODE, &(len.min(u32::MAX as usize) as u32).to_le_bytes());
        for chunk in bytes.utf8_chunks() {
            self.sink.put(chunk.valid().as_bytes());
            if !chunk.invalid().is_empty() {
                self.sink.put("\u{fffd}".as_bytes());
            }
        }
    }

    /// A string written once and then recalled from memo slot `slot` (< SHORT_MEMO): dict keys
    /// and repeated values cost two bytes after their first use. A slot stands for one string.
    pub fn memo_str(&mut self, slot: u8, s: &str) {
        let (word, bit) = (usize::from(slot) / 64, 1u64 << (slot % 64));
        let Some(w) = self.memoized.get_mut(word) else { return };
        if *w & bit != 0 {
            self.op_with(BINGET, &[slot]);
            return;
        }
        *w |= bit;
        self.str(s.as_bytes());
        self.op_with(BINPUT, &[slot]);
    }

    /// Remembers the object on top of the stack as memo `index` (SHORT_MEMO or more).
    pub fn memo_put_long(&mut self, index: u32) {
        self.op_with(LONG_BINPUT, &index.to_le_bytes());
    }

    /// Pushes the object remembered as memo `index` again (the same object, not a copy).
    pub fn memo_get_long(&mut self, index: u32) {
        self.op_with(LONG_BINGET, &index.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pickled(f: impl FnOnce(&mut Pickler<Vec<u8>>)) -> Vec<u8> {
        let mut p = Pickler::new(Vec::new());
        p.proto();
        f(&mut p);
        p.stop();
        p.sink
    }

    /// The bytes Python 3's `pickle.dumps(x, protocol=2)` gives for the same values.
    #[test]
    fn ints_take_the_shortest_form() {
        assert_eq!(pickled(|p| p.uint(0)), b"\x80\x02K\x00.");
        assert_eq!(pickled(|p| p.uint(255)), b"\x80\x02K\xff.");
        assert_eq!(pickled(|p| p.uint(256)), b"\x80\x02M\x00\x01.");
        assert_eq!(pickled(|p| p.uint(65536)), b"\x80\x02J\x00\x00\x01\x00.");
        assert_eq!(pickled(|p| p.uint(0x7fff_ffff)), b"\x80\x02J\xff\xff\xff\x7f.");
        // pickle.dumps(2**31, 2) == b'\x80\x02\x8a\x05\x00\x00\x00\x80\x00.'
        assert_eq!(pickled(|p| p.uint(1 << 31)), b"\x80\x02\x8a\x05\x00\x00\x00\x80\x00.");
        // pickle.dumps(0x7f00_0000_0000, 2) == b'\x80\x02\x8a\x06\x00\x00\x00\x00\x00\x7f.'
        assert_eq!(pickled(|p| p.uint(0x7f00_0000_0000)), b"\x80\x02\x8a\x06\x00\x00\x00\x00\x00\x7f.");
        assert_eq!(pickled(|p| p.uint(u64::MAX)), b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.");
        assert_eq!(pickled(|p| p.uint(1 << 32)), b"\x80\x02\x8a\x05\x00\x00\x00\x00\x01.");
    }

    #[test]
    fn containers_and_constants() {
        // pickle.dumps({'a': [1, True, None], 'b': (0, 0)}, 2) with the memo left out.
        let bytes = pickled(|p| {
            p.empty_dict();
            p.mark();
            p.str(b"a");
            p.empty_list();
            p.mark();
            p.uint(1);
            p.bool(true);
            p.none();
            p.appends();
            p.str(b"b");
            p.mark();
            p.uint(0);
            p.uint(0);
            p.tuple();
            p.setitems();
        });
        assert_eq!(bytes, b"\x80\x02}(X\x01\x00\x00\x00a](K\x01\x88NeX\x01\x00\x00\x00b(K\x00K\x00tu.");
    }

    #[test]
    fn strings_are_utf8_and_invalid_bytes_become_replacement_characters() {
        assert_eq!(pickled(|p| p.str("é".as_bytes())), b"\x80\x02X\x02\x00\x00\x00\xc3\xa9.");
        assert_eq!(pickled(|p| p.str(b"a\xffb")), b"\x80\x02X\x05\x00\x00\x00a\xef\xbf\xbdb.");
        assert_eq!(pickled(|p| p.str(b"")), b"\x80\x02X\x00\x00\x00\x00.");
    }

    #[test]
    fn memo_recalls_strings_and_objects() {
        let bytes = pickled(|p| {
            p.memo_str(3, "size");
            p.memo_str(3, "size");
            p.memo_put_long(300);
            p.memo_get_long(300);
        });
        assert_eq!(bytes, b"\x80\x02X\x04\x00\x00\x00sizeq\x03h\x03r\x2c\x01\x00\x00j\x2c\x01\x00\x00.");
    }

    #[test]
    fn fd_sink_writes_through_a_small_buffer() {
        let (read_end, write_end) = crate::sys::files::pipe();
        let mut p = Pickler::new(FdSink::<7>::new(write_end));
        p.proto();
        p.str(b"0123456789");
        p.stop();
        assert_eq!(p.sink.finish(), Ok(()));
        crate::sys::files::close(write_end).unwrap();
        let mut got = vec![];
        // SAFETY: the read end is ours, and the File takes it over.
        std::io::Read::read_to_end(&mut unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(read_end) }, &mut got).unwrap();
        assert_eq!(got, b"\x80\x02X\x0a\x00\x00\x000123456789.");
        let mut bad = FdSink::<4>::new(-1);
        bad.put(b"0123456789");
        assert_eq!(bad.finish(), Err(libc::EBADF));
    }
}
