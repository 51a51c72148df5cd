use super::*;

fn registry() -> Box<Registry> {
    // SAFETY: every field is an atomic integer or padding, for which all zeroes is a value.
    let r: Box<Registry> = unsafe { Box::new(core::mem::zeroed()) };
    assert!(r.adopt());
    r
}

const GPU: Key = [7, 9];
const OTHER_GPU: Key = [8, 9];

#[test]
fn a_file_of_another_version_is_not_used() {
    let r = registry();
    assert!(r.adopt(), "ours: adopted again");
    r.magic.store(u64::from_le_bytes(*b"TMNEIGH0"), Relaxed);
    assert!(!r.adopt());
}

#[test]
fn an_ask_reaches_the_live_processes_on_the_same_gpu_only() {
    let r = registry();
    let (a, b, c) = (r.claim(100, 0, |_| true).unwrap(), r.claim(200, 0, |_| true).unwrap(), r.claim(300, 0, |_| true).unwrap());
    r.enter(a, GPU).unwrap();
    r.enter(b, OTHER_GPU).unwrap();
    r.enter(c, GPU).unwrap();
    let mut out = [Asked::default(); 4];
    // Process 100 asks: not itself, not 200 (another GPU), not 300 when it died.
    assert_eq!(r.ask(100, GPU, |_, o| o.pid != 300, &mut out), 0);
    let n = r.ask(100, GPU, |_, _| true, &mut out);
    assert_eq!(&out[..n], &[Asked { slot: c, pid: 300, ticket: 1 }]);
    assert!(!r.answered(out[0]));
    // The owner of c sees device entry 0 wanted, serves, answers the doorbell it read.
    let mut seen = [0; DEVICES];
    let bell = r.doorbell(c).unwrap().load(Acquire);
    assert_eq!(r.take_wanted(c, &mut seen), 1);
    assert_eq!(r.take_wanted(c, &mut seen), 0, "served once");
    r.answer(c, bell);
    assert!(r.answered(out[0]));
}

#[test]
fn an_ask_after_the_owner_read_its_doorbell_waits_for_the_next_answer() {
    let r = registry();
    let c = r.claim(300, 0, |_| true).unwrap();
    r.enter(c, GPU).unwrap();
    let mut seen = [0; DEVICES];
    let bell = r.doorbell(c).unwrap().load(Acquire);
    r.take_wanted(c, &mut seen);
    let mut out = [Asked::default(); 1];
    r.ask(1, GPU, |_, _| true, &mut out);
    r.answer(c, bell);
    assert!(!r.answered(out[0]), "served before the ask: not its answer");
    let bell = r.doorbell(c).unwrap().load(Acquire);
    assert_eq!(r.take_wanted(c, &mut seen), 1);
    r.answer(c, bell);
    assert!(r.answered(out[0]));
}

#[test]
fn a_dead_processs_slot_is_taken_with_its_devices_forgotten() {
    let r = registry();
    let old = r.claim(100, 0, |_| true).unwrap();
    r.enter(old, GPU).unwrap();
    for pid in 101..(100 + SLOTS as u32) {
        r.claim(pid, 0, |_| true).unwrap();
    }
    assert_eq!(r.claim(999, 0, |_| true), None, "full, everyone alive");
    let taken = r.claim(999, 0, |pid| pid != 100).unwrap();
    assert_eq!(taken, old);
    let mut out = [Asked::default(); 4];
    assert_eq!(r.ask(1, GPU, |_, _| true, &mut out), 0, "the dead process's GPU is not the new one's");
    assert_eq!(r.claim(999, 0, |_| true), Some(taken), "a pid holds one slot");
}

#[test]
fn garbage_in_the_file_never_indexes_or_sizes_anything() {
    let r = registry();
    let c = r.claim(300, 0, |_| true).unwrap();
    r.enter(c, GPU).unwrap();
    // Another process scribbles every word of the slot.
    r.slots[c].doorbell.store(u32::MAX, Relaxed);
    r.slots[c].answered.store(12345, Relaxed);
    r.slots[c].devices[0].wanted.store(0x7fff_0000, Relaxed);
    let mut out = [Asked::default(); 2];
    let n = r.ask(1, GPU, |_, _| true, &mut out);
    assert_eq!(n, 1);
    assert_eq!(out[0].ticket, 0, "the doorbell wrapped");
    let mut seen = [0; DEVICES];
    assert_eq!(r.take_wanted(c, &mut seen), 1);
    // Every device entry filled: entering one more is refused, never out of bounds.
    for k in 1..DEVICES as u64 {
        r.enter(c, [k + 100, 0]).unwrap();
    }
    assert_eq!(r.enter(c, [999, 0]), None);
    assert_eq!(r.enter(SLOTS + 5, GPU), None);
}

#[test]
fn counters_compare_across_the_wrap() {
    assert!(reached(3, u32::MAX));
    assert!(!reached(u32::MAX, 3));
    assert!(reached(5, 5));
}

#[test]
fn an_ask_reaches_every_process_the_table_holds() {
    // Issue 36: asks stopped at 16; every slot's process is asked now.
    let r = registry();
    for pid in 1..=SLOTS as u32 {
        let s = r.claim(pid, 0, |_| true).unwrap();
        r.enter(s, GPU).unwrap();
    }
    let mut out = [Asked::default(); SLOTS];
    assert_eq!(r.ask(1, GPU, |_, _| true, &mut out), SLOTS - 1);
    assert!(out.iter().take(SLOTS - 1).all(|a| a.pid != 1 && r.pid(a.slot) == a.pid));
    // A process let the last ask wait out its bound: it is skipped by slot and pid.
    let silent = out[40];
    assert_eq!(r.ask(1, GPU, |slot, o| (slot, o.pid) != (silent.slot, silent.pid), &mut out), SLOTS - 2);
    r.leave(silent.slot, silent.pid);
    assert_eq!(r.pid(silent.slot), 0, "left: free for the next process");
}

/// Note [A pid given again]: a slot says when its owner started; a slot claimed by a version that
/// records no start (its pid written over another's record) says nothing, and is asked as before.
#[test]
fn a_slot_says_when_its_owner_started() {
    let r = registry();
    let a = r.claim(100, 5_000, |_| true).unwrap();
    r.enter(a, GPU).unwrap();
    let owners = |r: &Registry| {
        let seen = std::cell::RefCell::new(Vec::new());
        let mut out = [Asked::default(); 4];
        r.ask(1, GPU, |_, o| {
            seen.borrow_mut().push(o);
            false
        }, &mut out);
        seen.into_inner()
    };
    assert_eq!(owners(&r), [Owner { pid: 100, started: Some(5_000) }]);
    // Another version takes the slot after 100 died: it writes its pid only.
    r.slots[a].pid.store(200, Relaxed);
    assert_eq!(owners(&r), [Owner { pid: 200, started: None }]);
    // A process that could not read its start.
    let b = r.claim(300, 0, |_| true).unwrap();
    r.enter(b, GPU).unwrap();
    assert_eq!(owners(&r)[1], Owner { pid: 300, started: None });
}
