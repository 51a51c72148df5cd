"""Issue 19 under LD_PRELOAD, each case beside glibc alone: a reused large block is plain memory
whatever its previous owner did to its pages (mprotect read-only, read+exec or a PROT_NONE guard
page; MADV_DONTFORK, MADV_WIPEONFORK, MADV_DONTDUMP; mlock), for the next malloc, calloc and
gathered request and in a forked child; a child forked while idle blocks are being released
keeps none of the parent's cached blocks and can trim its cache; calloc zeroes the whole usable
size of a dirty reused block.

TM_TEST_LIB=PATH runs the same tests against another build (an older library, to see them fail).
"""
import os
import re
import subprocess

import pytest

from conftest import LIB, compile_c, compile_cxx, ok, run

PRELOAD = os.environ.get("TM_TEST_LIB") or str(LIB)

# Library settings; None is glibc alone (no preload).
MODES = {
    "defaults": {},
    "release-0": {"TENSORMALLOC_HOST_RELEASE_MS": "0"},
    "no-hugepages": {"TENSORMALLOC_HUGEPAGES": "never"},
    "reset-always": {"TENSORMALLOC_RESET": "always"},
    "glibc": None,
}


def run_mode(mode, argv, env=None, **kw):
    settings = MODES[mode]
    if settings is None:
        return run(argv, preload=False, env=env, **kw)
    return run(argv, preload=PRELOAD, env={**settings, **(env or {})}, **kw)


TAINTS = ["rdonly", "rx", "guard", "dontfork", "wipeonfork", "mlock", "dontdump", "mergeable", "guardregion", "unmapped", "fixedmap",
          "shrunk"]
# A change made with a raw system call never reaches our libc shims (Note [Pages the program
# changed]): only TENSORMALLOC_RESET=always makes such a block plain again (docs/limits.md).
CASES = [(t, m) for t in TAINTS for m in MODES] + [("raw-rdonly", "reset-always"), ("raw-rdonly", "glibc")]


@pytest.mark.parametrize("taint,mode", CASES)
def test_reused_block_is_plain_memory(taint, mode):
    """The next malloc, calloc and bigger (gathered) malloc after a block left read-only, rx,
    guarded, don't-fork, wipe-on-fork, locked or don't-dump is writable in every page, zero for
    calloc, read-write with default advice in smaps, intact in a forked child; a child of the
    first owner allocates from its cache safely; a locked block leaves VmLck at zero once freed
    and MADV_FREE in use (see c/plain_memory.c)."""
    out = ok(run_mode(mode, [compile_c("plain_memory"), taint], timeout=60))
    if "skipped" in out.stdout:
        pytest.skip(out.stdout.strip())
    assert f"plain memory {taint} ok" in out.stdout


FIG = re.compile(r"max child RssAnon kB: after-fork (-?\d+) after-trim (-?\d+) after-own-blocks (-?\d+)")
TOLERANCE_KB = 64 * 1024


@pytest.fixture(scope="module")
def glibc_child_rss():
    out = ok(run([compile_c("fork_release")], preload=False, env={"TENSORMALLOC_HOST_RELEASE_MS": "50"}, timeout=60))
    return [int(x) for x in FIG.search(out.stdout).groups()]


@pytest.mark.parametrize("release_ms", ["50", "0"])
def test_child_forked_while_blocks_are_released_keeps_none(release_ms, glibc_child_rss):
    """6 x 64 MiB written and freed, fork 0 to 2x the release delay later: the child's RssAnon
    (right after the fork, after tm_trim, after large blocks of its own) is within 64 MiB of a
    child under glibc alone, and tm_trim empties its cache."""
    out = ok(run([compile_c("fork_release")], preload=PRELOAD, env={"TENSORMALLOC_HOST_RELEASE_MS": release_ms}, timeout=60))
    ours = [int(x) for x in FIG.search(out.stdout).groups()]
    for what, kb, plain in zip(["after the fork", "after tm_trim", "after its own blocks"], ours, glibc_child_rss):
        assert kb <= plain + TOLERANCE_KB, f"child RssAnon {what}: {kb} kB, under glibc {plain} kB\n{out.stdout}"
    assert "fork release ok" in out.stdout


@pytest.mark.parametrize("mode", MODES)
def test_calloc_zeroes_the_whole_usable_size(mode):
    """calloc(6 MiB + 1) (and other odd sizes) from a dirty freed 8 MiB block: every byte up to
    malloc_usable_size reads zero."""
    out = ok(run_mode(mode, [compile_c("calloc_usable")]))
    assert "calloc usable ok" in out.stdout


@pytest.mark.parametrize("preload", ["tensormalloc", "glibc"])
def test_children_forked_while_blocks_move_map_their_own_memory_freely(preload):
    """Note [Blocks in flight]: forks land while other threads take blocks from the cache and
    give them back; each child maps and frees memory of its own (glibc's mmap, placed in the
    holes uninherited blocks left). A child that kept a record of a block it did not inherit
    took its own pointer for the inside of ours and aborted (the first fork or two, before)."""
    out = ok(run([compile_c("fork_in_flight"), "300"], preload=PRELOAD if preload == "tensormalloc" else False, timeout=120))
    assert "300 forks ok" in out.stdout, out


@pytest.mark.parametrize("setting", ["stats-json", "defaults", "glibc"])
def test_a_child_forked_mid_pass_finds_every_lock_free(setting, tmp_path):
    """Note [Locks a child inherits] (src/sys/lock.rs): 10000 forks while our background thread
    passes all the time (a thread frees 4 MiB blocks, released after 1 ms); each child asks for
    the stats and a large block and exits. A child forked while the pass (or, under
    TENSORMALLOC_STATS=json, its rewrite of the numbers) held a device pool's lock slept in
    tm_get_stats for good: 1 in 2000 to 6000 before (every run of 10000 failed), and in CI's
    fork_release once."""
    env = {"TENSORMALLOC_HOST_RELEASE_MS": "1"}
    if setting == "stats-json":
        env["TENSORMALLOC_STATS"] = f"json:{tmp_path}/s.%p.json"
    out = ok(run([compile_c("fork_mid_pass"), "10000"], preload=False if setting == "glibc" else PRELOAD, env=env, timeout=240))
    assert "forks 10000 hung 0 failed 0" in out.stdout, out


@pytest.mark.parametrize("how", ["raw", "_Fork"])
@pytest.mark.parametrize("preload", ["tensormalloc", "glibc"])
def test_a_child_made_without_fork_handlers_keeps_its_own_memory(how, preload):
    """Note [Children our handlers did not see] (src/sys/fork_mark.rs): a child made by the fork
    system call itself or glibc's _Fork() runs no fork handler; its own 66 MiB mapping lands
    where a cached block kept from children was. Its 64 MiB malloc must not be that mapping, and
    malloc_trim must leave it mapped (before: malloc handed out the child's own mapping and
    overwrote it)."""
    out = ok(run([compile_c("fork_unseen"), how], preload=PRELOAD if preload == "tensormalloc" else False))
    assert "child ok" in out.stdout, out


def test_a_child_made_without_fork_handlers_mid_pass_finds_every_lock_free():
    """As the 10,000 forks above, made by the fork system call itself: no handler of ours runs,
    and the churning thread, not only ours, may hold the cache lock at the fork; each child first
    forks a child of its own with fork(). The child adopts the parent's records at its first use
    of them, or in our prepare handler (Note [Children our handlers did not see]). Before, 3 of
    the first 3,000 children slept for good, and with only the first use adopting, in the
    prepare handler. Not run under glibc alone: there a child made so while the churning thread
    holds an arena lock would sleep as well."""
    out = ok(run([compile_c("fork_mid_pass"), "3000", "raw"], env={"TENSORMALLOC_HOST_RELEASE_MS": "1"}, preload=PRELOAD, timeout=240))
    assert "forks 3000 hung 0 failed 0" in out.stdout, out


@pytest.mark.parametrize("mode", ["defaults", "glibc"])
def test_a_child_never_takes_a_block_kept_from_it_for_its_own(mode):
    """A block advised MADV_DONTFORK is not in a forked child; the child's own mapping there is
    never handed out as a block, and the child's stats count the block no more
    (c/fork_kept.c)."""
    out = ok(run_mode(mode, [compile_c("fork_kept")], timeout=60))
    assert "fork kept ok" in out.stdout


@pytest.mark.parametrize("mode", ["defaults", "glibc"])
def test_a_child_given_part_of_a_block_keeps_its_own_mapping_in_the_hole(mode):
    """Note [A block the child has in part]: 4 MiB in the middle of a 16 MiB block kept from
    children; the child maps its own memory in the hole and frees the block. The old library
    unmapped the child's mapping with the block (recorded at its whole length), and took the
    hole for the inside of its block (a glibc chunk placed there aborted as an invalid pointer:
    the integrity hunter's fuzzer)."""
    out = ok(run_mode(mode, [compile_c("fork_kept"), "part"], timeout=60))
    assert "fork kept part ok" in out.stdout


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="hold_our_thread reads x86-64 registers")
@pytest.mark.parametrize("case", ["release-lazy", "release-now", "unmap", "beside"])
def test_a_mapping_over_a_block_whose_release_is_stalled_waits_for_it(case):
    """Note [Ranges the program claims]: our thread is held (ptrace) for 8 s at the idle
    release's madvise of a freed 64 MiB block (`release-*`), or at the munmap that expires it
    (`unmap`, Note [Ranges in transit]); the program maps pages of its own there meanwhile. The
    old library's mmap gave up waiting after 5 s, and the release then madvised and unmapped the
    program's pages (SIGSEGV, the sched hunter's claimx.c; `unmap` on the library of 2026-11-28):
    now the mmap waits, with a line. `beside`: the program unmaps part of a live block of its own
    meanwhile, away from the stalled unmap, which the old library waited 5 s for: now at once."""
    mode, release = (case.split("-") + ["lazy"])[:2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORMALLOC_")}
    env.update({"LD_PRELOAD": PRELOAD, "TENSORMALLOC_HOST_RELEASE": release})
    if mode != "release":
        env.update({"TENSORMALLOC_HOST_RELEASE_MS": "100", "TENSORMALLOC_HOST_UNMAP_MS": "500"})
    program = subprocess.Popen([compile_c("claim_stalled"), mode], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hold = None
    try:
        assert program.stdout.readline() == "ready\n"
        call = "madvise" if mode == "release" else "munmap"
        hold = subprocess.Popen([compile_c("hold_our_thread"), str(program.pid), "8", call], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The block is freed once the tracer is attached, however slow its start (the flake hunter).
        assert hold.stdout.readline() == "attached\n", hold.communicate(timeout=60)
        program.stdin.write("go\n")
        program.stdin.flush()
        held, why = hold.communicate(timeout=60)
        assert hold.returncode == 0 and "held" in held, (held, why)
        out, err = program.communicate(timeout=60)
    finally:
        program.kill()
        if hold:
            hold.kill()
    assert program.returncode == 0 and "claim stalled ok" in out, (program.returncode, out, err)
    waited = float(re.search(r"took ([\d.]+) s", out).group(1))
    if mode == "beside":
        assert waited < 1 and err == "", (out, err)
    else:
        assert waited > 5, out
        assert "waits for that release" in err, err


def test_a_munmap_beside_many_threads_in_transit_does_not_wait_for_all_of_them():
    """Note [Ranges in transit]: 40 threads churn blocks of 128 KiB to 8 MiB under a 64 MiB cache,
    so many are unmapping at once, while the main thread maps and unmaps 64 KiB of its own every
    millisecond (c/claim_latency.c). With 16 slots for the spans of threads in transit, the
    seventeenth counted as spanning everything and every munmap near our blocks waited for it:
    the old library's worst munmap took 4.2-5.1 s in 3 of 3 runs (glibc unmapping every block
    itself: 76-92 ms; this library: 133-187 ms)."""
    out = ok(run([compile_c("claim_latency"), "40", "4"], env={"TENSORMALLOC_CACHE_BYTES": "64M"}, timeout=120))
    worst_us = float(re.search(r"max_us (\d+)", out.stdout).group(1))
    assert worst_us < 1_500_000, out.stdout
    assert out.stderr == "", out.stderr


CLAIM_SETTINGS = {
    # The idle pause in c/claimed.c outlasts the release and the unmap.
    "short-idle": {"TENSORMALLOC_HOST_RELEASE_MS": "50", "TENSORMALLOC_HOST_UNMAP_MS": "200"},
    "drop-at-once": {"TENSORMALLOC_HOST_RELEASE": "now", "TENSORMALLOC_HOST_RELEASE_MS": "50"},
    "defaults": {},
    "glibc": None,
}


@pytest.mark.parametrize("setting", CLAIM_SETTINGS)
@pytest.mark.parametrize("what", ["fixed", "noreplace", "munmap", "shm-freed", "shm-remap", "shm-detach"])
def test_pages_the_program_puts_where_a_freed_block_was_are_its_own(what, setting):
    """Note [Ranges the program claims] (src/host/host_layer/claim.rs): glibc's free unmapped the
    block, so the program may map there (MAP_FIXED, MAP_FIXED_NOREPLACE) or unmap part of it.
    Before: the next malloc handed out the program's own mapping and overwrote it, the idle
    release dropped its pages (MADV_DONTNEED), the expiry and malloc_trim unmapped it
    (SIGSEGV), MAP_FIXED_NOREPLACE failed with EEXIST, and after the munmap the next malloc's
    block had a hole (SIGSEGV). A SysV segment attached inside a freed block failed (EINVAL);
    one attached over part of a live block with SHM_REMAP was handed out in the next blocks
    once the block was freed (other processes' memory), or left a hole once detached."""
    env = CLAIM_SETTINGS[setting]
    argv = [compile_c("claimed"), what]
    out = ok(run(argv, preload=False, timeout=60) if env is None else run(argv, preload=PRELOAD, env=env, timeout=60))
    if "skipped" in out.stdout:
        pytest.skip(out.stdout.strip())
    assert f"claimed {what} ok" in out.stdout


@pytest.mark.parametrize("preload", ["tensormalloc", "glibc"])
@pytest.mark.parametrize("how", ["ro", "dontfork", "wipeonfork", "mlock", "ro-within", "dontfork-within", "wipeonfork-within", "mlock-within"])
def test_a_changed_block_grown_by_realloc_is_plain(how, preload):
    """1 MiB of a 16 MiB block made read-only, kept from or wiped in children, or locked, then
    realloc to 64 MiB: the grown block is writable, unlocked and whole in a forked child, as
    glibc's copy is. Before, the block grew in place or by mremap with the change in it: SIGSEGV
    writing it, a child killed or reading zeros, VmLck 1 MiB for its life. `-within`: growths
    that fit the block's rounding (5,000,000 to 5,500,000 bytes, 200,000 to 250,000; Note
    [Growing a changed block]), which kept the change in place until the twelfth session.
    glibc's threshold is fixed for them: its dynamic one would put the 200,000 bytes on its heap
    after the first free, where a growth at the top keeps its changes under glibc too."""
    fixed = {"MALLOC_MMAP_THRESHOLD_": "131072"} if how.endswith("-within") and preload == "glibc" else {}
    out = ok(run([compile_c("claimed"), f"grow-{how}"], preload=PRELOAD if preload == "tensormalloc" else False, env=fixed, timeout=60))
    if "skipped" in out.stdout:
        pytest.skip(out.stdout.strip())
    assert f"claimed grow-{how} ok" in out.stdout


@pytest.mark.parametrize("preload", ["tensormalloc", "glibc"])
def test_pages_the_program_puts_where_a_freed_block_was_survive_in_a_child_of_an_allocating_fork_handler(preload):
    """Note [Inside our own work] (src/sys/lock.rs): a forked child whose first child handler,
    another library's, allocates (the child adopts the parent's records before our handler runs).
    The fork's hold on the cache lock stayed counted on the child's thread, every claim there
    was skipped, and the next malloc handed out the program's own mapping (then SIGSEGV)."""
    lib = compile_cxx("fork_prelib", shared=True)
    exe = compile_c("fork_claim", extra=[lib, f"-Wl,-rpath,{os.path.dirname(lib)}"])
    out = ok(run([exe], preload=PRELOAD if preload == "tensormalloc" else False, timeout=60))
    assert "fork claim ok" in out.stdout
