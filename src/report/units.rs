//! Numbers as people read them, formatted without allocation: sizes in binary units, durations
//! with three significant digits, and any of them padded as one string. Shared by the exit
//! report and the leak report.

use crate::sys::stderr::StackWriter;
use core::fmt::{self, Write};

/// Bytes in binary units: "80.0 MiB".
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut unit = 0;
        while v >= 1024.0 && unit + 1 < UNITS.len() {
            v /= 1024.0;
            unit += 1;
        }
        let name = UNITS.get(unit).copied().unwrap_or("B");
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {name}")
        }
    }
}

/// A duration in the unit that keeps three significant digits: "850ns", "12.3us", "1.20s".
/// A count and its noun, singular for one: `Count(1, "block")` is "1 block", `Count(3, "block")`
/// "3 blocks".
pub struct Count(pub u64, pub &'static str);

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}{}", self.0, self.1, if self.0 == 1 { "" } else { "s" })
    }
}

pub struct Nanos(pub u64);

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0 as f64;
        if ns < 1e3 {
            write!(f, "{}ns", self.0)
        } else if ns < 1e6 {
            write!(f, "{:.1}us", ns / 1e3)
        } else if ns < 1e9 {
            write!(f, "{:.1}ms", ns / 1e6)
        } else {
            write!(f, "{:.2}s", ns / 1e9)
        }
    }
}

/// A `Display` rendered into a small stack string, so width and alignment apply to it whole.
pub struct StackStr {
    buf: [u8; 32],
    len: usize,
}

impl fmt::Display for StackStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(core::str::from_utf8(self.buf.get(..self.len).unwrap_or(&[])).unwrap_or(""))
    }
}

trait ToStack {
    fn to_stack(&self) -> StackStr;
}

impl<T: fmt::Display> ToStack for T {
    fn to_stack(&self) -> StackStr {
        let mut w = StackWriter::<32>::new();
        let _ = write!(w, "{self}");
        let bytes = w.as_bytes();
        let mut out = StackStr { buf: [0; 32], len: bytes.len() };
        if let Some(dst) = out.buf.get_mut(..bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        out
    }
}

/// A `Display` rendered on the stack so width and alignment apply to it whole.
pub fn pad<T: fmt::Display>(value: T) -> StackStr {
    value.to_stack()
}

/// JSON string contents: quotes, backslashes and control characters escaped.
pub struct JsonText<'a>(pub &'a [u8]);

impl fmt::Display for JsonText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '"' => f.write_str("\\\"")?,
                    '\\' => f.write_str("\\\\")?,
                    c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                    c => f.write_char(c)?,
                }
            }
            if !chunk.invalid().is_empty() {
                f.write_str("?")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(80 << 20).to_string(), "80.0 MiB");
        assert_eq!(Nanos(850).to_string(), "850ns");
        assert_eq!(Nanos(12_300).to_string(), "12.3us");
        assert_eq!(Nanos(1_200_000_000).to_string(), "1.20s");
    }
}
