//! Fixed-capacity tables in memory of our own (mapped once, never through the malloc family):
//! a slab of records addressed by index, and an address -> index hash map with linear probing
//! and backward-shift deletion (no tombstones, so it never needs rebuilding).

use crate::backing::TableSource;

pub const NONE: u32 = u32::MAX;

/// `capacity` records of `T`, mapped on first use. Records are never moved.
pub struct Slab<T: Copy> {
    base: *mut T,
    capacity: u32,
    /// Head of the list of vacant indices, threaded through `next_vacant`.
    vacant_head: u32,
    next_vacant: *mut u32,
    used: u32,
}

// SAFETY: the slab is only reached through the pool's lock.
unsafe impl<T: Copy + Send> Send for Slab<T> {}

impl<T: Copy> Slab<T> {
    pub const fn empty() -> Self {
        Slab { base: core::ptr::null_mut(), capacity: 0, vacant_head: NONE, next_vacant: core::ptr::null_mut(), used: 0 }
    }

    /// Maps room for `capacity` records; false when the system refuses.
    pub fn init(&mut self, capacity: u32, source: TableSource) -> bool {
        if !self.base.is_null() {
            return true;
        }
        let bytes = capacity as usize * (core::mem::size_of::<T>() + core::mem::size_of::<u32>());
        let Some(mem) = source(bytes) else { return false };
        self.base = mem as *mut T;
        // SAFETY: the mapping holds capacity records followed by capacity u32 links.
        self.next_vacant = unsafe { self.base.add(capacity as usize) } as *mut u32;
        self.capacity = capacity;
        self.vacant_head = NONE;
        self.used = 0;
        true
    }

    pub fn insert(&mut self, value: T) -> Option<u32> {
        let index = if self.vacant_head != NONE {
            let i = self.vacant_head;
            // SAFETY: i < capacity (only valid indices enter the vacant list).
            self.vacant_head = unsafe { *self.next_vacant.add(i as usize) };
            i
        } else if self.used < self.capacity {
            self.used += 1;
            self.used - 1
        } else {
            return None;
        };
        // SAFETY: index < capacity.
        unsafe { self.base.add(index as usize).write(value) };
        Some(index)
    }

    pub fn remove(&mut self, index: u32) {
        if index < self.used {
            // SAFETY: index < capacity.
            unsafe { *self.next_vacant.add(index as usize) = self.vacant_head };
            self.vacant_head = index;
        }
    }

    /// Forgets every record; the memory stays mapped for reuse.
    pub fn clear(&mut self) {
        self.vacant_head = NONE;
        self.used = 0;
    }

    /// Callers pass only indices `insert` returned and not yet removed.
    pub fn get(&self, index: u32) -> &T {
        debug_assert!(index < self.used);
        // SAFETY: callers pass indices returned by insert and not yet removed.
        unsafe { &*self.base.add(index as usize) }
    }

    pub fn get_mut(&mut self, index: u32) -> &mut T {
        debug_assert!(index < self.used);
        // SAFETY: as in get.
        unsafe { &mut *self.base.add(index as usize) }
    }
}

#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    key: u64,
    value: u32,
    occupied: u32,
}

/// address -> record index, at most 7/8 full.
pub struct AddrMap {
    slots: *mut Slot,
    mask: usize,
    len: usize,
}

// SAFETY: reached only through the pool's lock.
unsafe impl Send for AddrMap {}

fn hash(key: u64) -> usize {
    // Fibonacci hashing: device addresses share low bits, so mix the high ones in.
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20) as usize
}

impl AddrMap {
    pub const fn empty() -> Self {
        AddrMap { slots: core::ptr::null_mut(), mask: 0, len: 0 }
    }

    /// `capacity` is a power of two.
    pub fn init(&mut self, capacity: usize, source: TableSource) -> bool {
        if !self.slots.is_null() {
            return true;
        }
        let Some(mem) = source(capacity * core::mem::size_of::<Slot>()) else { return false };
        self.slots = mem as *mut Slot;
        self.mask = capacity - 1;
        true
    }

    fn read(&self, i: usize) -> Slot {
        // SAFETY: i is masked to the table's size; the table lives as long as the map.
        unsafe { self.slots.add(i & self.mask).read() }
    }

    fn write(&mut self, i: usize, slot: Slot) {
        // SAFETY: as in read; &mut self makes this the only access.
        unsafe { self.slots.add(i & self.mask).write(slot) }
    }

    pub fn get(&self, key: u64) -> Option<u32> {
        if self.slots.is_null() {
            return None;
        }
        let mut i = hash(key);
        loop {
            let s = self.read(i);
            if s.occupied == 0 {
                return None;
            }
            if s.key == key {
                return Some(s.value);
            }
            i = i.wrapping_add(1);
        }
    }

    /// False when the map is full (the caller then leaves the block untracked).
    pub fn insert(&mut self, key: u64, value: u32) -> bool {
        if self.slots.is_null() || (self.len + 1) * 8 > (self.mask + 1) * 7 {
            return false;
        }
        let mut i = hash(key);
        loop {
            let s = self.read(i);
            if s.occupied == 0 || s.key == key {
                if s.occupied == 0 {
                    self.len += 1;
                }
                self.write(i, Slot { key, value, occupied: 1 });
                return true;
            }
            i = i.wrapping_add(1);
        }
    }

    pub fn remove(&mut self, key: u64) -> Option<u32> {
        if self.slots.is_null() {
            return None;
        }
        let mut i = hash(key) & self.mask;
        loop {
            let s = self.read(i);
            if s.occupied == 0 {
                return None;
            }
            if s.key == key {
                break;
            }
            i = (i + 1) & self.mask;
        }
        let value = self.read(i).value;
        // Backward-shift deletion: pull later members of the probe run into the hole.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let s = self.read(j);
            if s.occupied == 0 {
                break;
            }
            let home = hash(s.key) & self.mask;
            let stays = if hole <= j { hole < home && home <= j } else { hole < home || home <= j };
            if !stays {
                self.write(hole, s);
                hole = j;
            }
        }
        self.write(hole, Slot { key: 0, value: 0, occupied: 0 });
        self.len -= 1;
        Some(value)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Every (key, value), in no particular order.
    pub fn for_each(&self, mut f: impl FnMut(u64, u32)) {
        if self.slots.is_null() {
            return;
        }
        for i in 0..=self.mask {
            let s = self.read(i);
            if s.occupied != 0 {
                f(s.key, s.value);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Removes every entry (a walk over the whole table: for rare events such as a reset).
    pub fn clear(&mut self) {
        if self.slots.is_null() || self.len == 0 {
            return;
        }
        for i in 0..=self.mask {
            if self.read(i).occupied != 0 {
                self.write(i, Slot { key: 0, value: 0, occupied: 0 });
            }
        }
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::leak_table;
    use std::collections::HashMap;

    #[test]
    fn map_matches_a_hashmap_under_random_churn() {
        let mut m = AddrMap::empty();
        assert!(m.init(1 << 10, leak_table));
        let mut shadow = HashMap::new();
        let mut x = 12345u64;
        for step in 0..crate::sim::rounds(200_000, 3_000) as u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = 0x7f00_0000_0000 + (x % 1500) * 512;
            if x.is_multiple_of(3) {
                assert_eq!(m.remove(key), shadow.remove(&key), "step {step}");
            } else if shadow.len() < 800 || shadow.contains_key(&key) {
                assert!(m.insert(key, step));
                shadow.insert(key, step);
            }
            assert_eq!(m.len(), shadow.len());
            let probe = 0x7f00_0000_0000 + (x.rotate_left(17) % 1500) * 512;
            assert_eq!(m.get(probe), shadow.get(&probe).copied());
        }
        for k in 0..900u64 {
            let key = 0x7f00_0000_0000 + k * 512;
            assert_eq!(m.get(key), shadow.get(&key).copied());
        }
    }

    #[test]
    fn map_refuses_when_full_and_slab_reuses_indices() {
        let mut m = AddrMap::empty();
        m.init(16, leak_table);
        let accepted = (0..20u64).filter(|&k| m.insert(k * 4096, 0)).count();
        assert_eq!(accepted, 14);
        let mut s: Slab<u64> = Slab::empty();
        s.init(2, leak_table);
        let a = s.insert(1).unwrap();
        let b = s.insert(2).unwrap();
        assert_eq!(s.insert(3), None);
        s.remove(a);
        assert_eq!(s.insert(4), Some(a));
        assert_eq!(*s.get(b), 2);
        assert_eq!(*s.get(a), 4);
    }
}
