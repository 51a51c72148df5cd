//! Our IPC handle (Note [IPC] in device/pool/pointers.rs): 64 bytes, the size of the driver's
//! CUipcMemHandle and the runtime's cudaIpcMemHandle_t, that name an entry of the exporting
//! user's registry and the block's place in the segment that entry names. Encoded and decoded
//! over plain bytes; a checksum rejects bytes that only start like ours. And what an entry of an
//! expandable block names in place of a driver's handle: the run of chunks it lies on.

/// Our handles' first bytes: no driver handle of ours ever starts so, and a driver that is given
/// one refuses it (it names nothing the driver knows).
pub const MAGIC: [u8; 8] = *b"tmIPCv1\0";

/// What our handle names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handle {
    /// The exporting process.
    pub pid: u32,
    /// Its registry entry.
    pub entry: u32,
    /// The entry's token when published: a later export in that entry has another.
    pub token: u64,
    /// The block's size and its offset in its segment.
    pub size: u64,
    pub offset: u64,
}

fn checksum(h: &Handle) -> u64 {
    // A mix of every field (no secret: it tells our bytes from others', not a forgery).
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (u64::from(h.pid) << 32 | u64::from(h.entry));
    for v in [h.token, h.size, h.offset] {
        x = (x ^ v).wrapping_mul(0xbf58_476d_1ce4_e5b9).rotate_left(31);
    }
    x
}

impl Handle {
    pub fn encode(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        let fields: [&[u8]; 7] = [&MAGIC, &self.pid.to_le_bytes(), &self.entry.to_le_bytes(), &self.token.to_le_bytes(), &self.size.to_le_bytes(), &self.offset.to_le_bytes(), &checksum(self).to_le_bytes()];
        let mut at = 0;
        for f in fields {
            if let Some(dst) = out.get_mut(at..at + f.len()) {
                dst.copy_from_slice(f);
            }
            at += f.len();
        }
        out
    }

    /// Ours, or None: a driver's handle (or garbage) goes to the driver as it is.
    pub fn decode(bytes: &[u8; 64]) -> Option<Handle> {
        if bytes.get(..8)? != MAGIC {
            return None;
        }
        let u32_at = |at: usize| bytes.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
        let u64_at = |at: usize| bytes.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        let h = Handle { pid: u32_at(8)?, entry: u32_at(12)?, token: u64_at(16)?, size: u64_at(24)?, offset: u64_at(32)? };
        let rest_zero = bytes.get(48..)?.iter().all(|&b| b == 0);
        (u64_at(40)? == checksum(&h) && rest_zero && h.token != 0).then_some(h)
    }

    /// Whether `bytes` start as ours (a damaged handle of ours is refused, not passed on).
    pub fn looks_ours(bytes: &[u8; 64]) -> bool {
        bytes.get(..8) == Some(&MAGIC[..])
    }
}

/// What a registry entry of an expandable block names in place of a driver's handle (Note [IPC
/// of expandable segments] in device/pool/exports.rs): the exporter's device and block (its
/// address and life, for the exporter to find it again when a peer asks) and the run of chunks
/// it lies on; the entry's offset is the block's place in that run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRun {
    pub device: u32,
    pub addr: u64,
    pub buffer_id: u64,
    pub chunk_bytes: u64,
    pub first_chunk: u64,
    pub chunks: u64,
}

/// A chunk run's first bytes: no driver handle the registry holds starts so.
pub const CHUNKS_MAGIC: [u8; 8] = *b"tmVMMv1\0";
/// The most chunks a run may have (2 TiB of 2 MiB chunks): more is garbage.
const MAX_CHUNKS: u64 = 1 << 20;

impl ChunkRun {
    pub fn encode(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        let words = [u64::from_le_bytes(CHUNKS_MAGIC), u64::from(self.device), self.addr, self.buffer_id, self.chunk_bytes, self.first_chunk, self.chunks];
        for (dst, w) in out.chunks_exact_mut(8).zip(words) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// A run, or None: bytes that are not one (a driver's handle), or not a plausible one.
    pub fn decode(bytes: &[u8; 64]) -> Option<ChunkRun> {
        let word = |k: usize| bytes.get(8 * k..8 * k + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        if word(0)? != u64::from_le_bytes(CHUNKS_MAGIC) || word(7)? != 0 {
            return None;
        }
        let run = ChunkRun { device: u32::try_from(word(1)?).ok()?, addr: word(2)?, buffer_id: word(3)?, chunk_bytes: word(4)?, first_chunk: word(5)?, chunks: word(6)? };
        let plausible = run.chunk_bytes.is_power_of_two() && (1..=MAX_CHUNKS).contains(&run.chunks) && run.chunks.checked_mul(run.chunk_bytes).is_some();
        plausible.then_some(run)
    }

    /// The run's bytes.
    pub fn bytes(&self) -> u64 {
        self.chunks.saturating_mul(self.chunk_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_run_survives_its_bytes_and_garbage_is_none() {
        let run = ChunkRun { device: 1, addr: 0x7f00_0020_1000, buffer_id: 42, chunk_bytes: 2 << 20, first_chunk: 0x7f00_0020_0000, chunks: 33 };
        let bytes = run.encode();
        assert_eq!(ChunkRun::decode(&bytes), Some(run));
        assert_eq!(run.bytes(), 66 << 20);
        assert_eq!(ChunkRun::decode(&[0; 64]), None, "a driver's handle is no run");
        assert_eq!(ChunkRun::decode(&ChunkRun { chunk_bytes: 3 << 20, ..run }.encode()), None, "not a granularity");
        assert_eq!(ChunkRun::decode(&ChunkRun { chunks: 0, ..run }.encode()), None);
        assert_eq!(ChunkRun::decode(&ChunkRun { chunks: u64::MAX >> 8, ..run }.encode()), None, "more than any device");
        let mut tail = bytes;
        tail[60] = 1;
        assert_eq!(ChunkRun::decode(&tail), None, "the tail must stay zero");
    }

    #[test]
    fn a_handle_survives_its_bytes_and_nothing_else_decodes() {
        let h = Handle { pid: 4242, entry: 17, token: 0xdead_beef_1234, size: 4096, offset: 6 << 20 };
        let bytes = h.encode();
        assert_eq!(Handle::decode(&bytes), Some(h));
        for i in 0..48 {
            let mut b = bytes;
            b[i] ^= 1;
            assert_ne!(Handle::decode(&b), Some(h), "byte {i} changed");
        }
        let mut b = bytes;
        b[63] = 1;
        assert_eq!(Handle::decode(&b), None, "the tail must stay zero");
        assert_eq!(Handle::decode(&[0; 64]), None, "a driver's handle is not ours");
        assert!(!Handle::looks_ours(&[7; 64]) && Handle::looks_ours(&bytes));
        // Two blocks of one segment never share a handle (PyTorch caches opened handles by bytes).
        assert_ne!(Handle { offset: 0, ..h }.encode(), bytes);
    }
}
