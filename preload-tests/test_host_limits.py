"""The host layer beside what else lives in the process (issue 19): an address-space limit set
before exec or by the program itself (Note [Room for others]), and another preloaded library that
hooks dlsym, before or after us (Note [Other dlsym hooks]). Each case also runs under glibc alone,
where it passes. TM_TEST_LIB=PATH runs them against another build (an older library, to see
them fail)."""
import os
import re
import resource
import shutil
import subprocess

import pytest

from conftest import BUILD, C_DIR, LIB, compile_c, ok, run

LIB = os.environ.get("TM_TEST_LIB") or str(LIB)


def hook_library():
    BUILD.mkdir(parents=True, exist_ok=True)
    out = BUILD / "dlsym_hook.so"
    src = C_DIR / "dlsym_hook.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out), str(src), "-ldl"], check=True)
    return str(out)


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("limit_mib", [1536, 2048, 4096])
@pytest.mark.parametrize("which", ["as", "data"])
def test_freed_memory_leaves_room_under_a_limit_the_program_sets(preload, limit_mib, which):
    """RLIMIT_AS, or RLIMIT_DATA (which counts private writable mappings, cached blocks and
    glibc's brk heap among them): 1 GiB freed leaves room for 500 MiB of small blocks, 900 of
    1 MiB, a 900 MiB mmap and 64 threads. Before RLIMIT_DATA was followed, the small blocks
    stopped at about 480 MiB under a 1536 MiB one."""
    out = ok(run([compile_c("address_limit"), str(limit_mib), which], preload=LIB if preload else False))
    assert "512000 of 512000" in out.stdout and "900 of 900" in out.stdout and "64 of 64" in out.stdout


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("trim", ["-1", "268435456"], ids=["never-trim", "trim-256M"])
@pytest.mark.parametrize("which", ["as", "data"])
def test_a_trim_threshold_the_program_set_leaves_room_under_a_limit_too(preload, trim, which):
    """mallopt(M_TRIM_THRESHOLD, n) is glibc's bound on the top of its heap (-1, "never trim",
    is the real-time recipe); its mmapped blocks are still unmapped at free. Under us it bounds
    the cache, and it kept the 1 GiB block cached under the limit: the small blocks, the mmap and
    the threads then failed (the pressure hunter: a stack overflow, sbrk, shmat and dlopen
    refused). The limit now wins over the program's bound."""
    out = ok(run([compile_c("address_limit"), "1536", which, trim], preload=LIB if preload else False))
    assert "room under the limit" in out.stdout and "512000 of 512000" in out.stdout and "900 of 900" in out.stdout and "64 of 64" in out.stdout


@pytest.mark.parametrize("which", ["as", "data"], ids=["ulimit-v", "ulimit-d"])
@pytest.mark.parametrize("setting", [{}, {"TENSORMALLOC_HOST_RELEASE_MS": "0"}], ids=["defaults", "release-0"])
def test_freed_memory_leaves_room_under_ulimit_v(setting, which):
    limit = 1536 << 20

    def ulimit():
        resource.setrlimit(resource.RLIMIT_AS if which == "as" else resource.RLIMIT_DATA, (limit, limit))

    # The program sets the same limit again: a no-op, so the limit is the one in force at exec.
    out = ok(run([compile_c("address_limit"), "1536", which], preload=LIB, env=setting, preexec_fn=ulimit))
    assert "512000 of 512000" in out.stdout and "900 of 900" in out.stdout


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("which", ["as", "data"])
def test_a_large_request_that_does_not_fit_is_served_from_the_next_allocators_free_memory(preload, which):
    """Under a limit 200 MiB over what is mapped, with 600 MiB of glibc's heap freed: 500 mallocs
    of 1 MiB, a calloc, a posix_memalign, a realloc of one of our blocks and one of a small
    block to 8 MiB all succeed
    from that heap, as under glibc alone, with no out-of-memory report (Note [The next
    allocator's free memory]). Before, the mallocs stopped at 181 and the rest failed."""
    out = ok(run([compile_c("next_room"), which], preload=LIB if preload else False))
    for line in ["1 MiB mallocs: 500 of 500", "served by the next allocator: some", "calloc 2 MiB: zero", "posix_memalign 2 MiB: aligned", "realloc to 8 MiB: kept", "realloc of a small block to 8 MiB: kept"]:
        assert line in out.stdout, out.stdout + out.stderr
    assert "out of memory" not in out.stderr, out.stderr


def test_a_refused_absurd_request_keeps_the_cache():
    out = ok(run([compile_c("address_limit"), "65536"], preload=LIB))
    assert "after a refused 64 TiB request: reused" in out.stdout


@pytest.mark.parametrize("order", ["hook-first", "tensormalloc-first", "hook-alone"])
def test_another_dlsym_hook_sees_every_lookup_in_either_order(order):
    hook = hook_library()
    preload = {"hook-first": f"{hook} {LIB}", "tensormalloc-first": f"{LIB} {hook}", "hook-alone": hook}[order]
    # A hang (our malloc resolving to itself) ends in the timeout: the test fails, never blocks.
    out = ok(run([compile_c("dlsym_user")], preload=preload, timeout=30))
    assert "dlsym user ok" in out.stdout
    assert "hook saw 3 probe lookups" in out.stderr, out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_impossible_requests_leave_the_cache_alone(preload):
    """An alignment or a size no memory could satisfy: NULL/ENOMEM as glibc answers, the cache as
    it was, and nothing on stderr (issue 29, item 4)."""
    out = ok(run([compile_c("impossible")], preload=preload, env={"TENSORMALLOC_HOST_UNMAP_MS": "60000"}))
    assert "impossible ok" in out.stdout
    assert out.stderr == ""


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("which", ["as", "data"])
def test_a_block_grows_under_a_limit_with_room_for_its_new_length(preload, which):
    """realloc of a 256 MiB block to 512 MiB that cannot grow in place, under RLIMIT_AS or
    RLIMIT_DATA with room for 512 MiB and 32 MiB more, not for both lengths at once: glibc's
    mremap(MREMAP_MAYMOVE) grows it, and so do we (Note [Growing under a limit]). Before, our
    move into a fresh mapping needed both lengths, and the realloc failed."""
    out = ok(run([compile_c("realloc_limit"), which], preload=LIB if preload else False))
    assert "realloc limit ok" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_program_limited_to_its_own_tasks_makes_its_threads(preload):
    """RLIMIT_NPROC set to the tasks the program has plus the two threads it makes, then a large
    block freed (our thread starts, a task): both threads are made, as under glibc alone (Note
    [Our thread's task]). Before, the second was refused with EAGAIN."""
    out = ok(run([compile_c("nproc_threads")], preload=LIB if preload else False, timeout=60))
    assert "nproc ok" in out.stdout, out.stdout + out.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("chrt") or not shutil.which("taskset"), reason="a real-time policy needs root, chrt and taskset")
@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_real_time_program_limited_to_its_own_tasks_makes_its_threads(preload):
    """As above, the program real-time (SCHED_RR) on one CPU with our thread: the retry while
    ours gives its task back sleeps between tries. It yielded, which a real-time caller never
    does to a normal thread on its CPU: it spun the whole 100 ms and the second thread was
    refused (the sched hunter)."""
    out = ok(run(["chrt", "-r", "10", "taskset", "-c", "0", compile_c("nproc_threads")], preload=LIB if preload else False, timeout=60))
    assert "nproc ok" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_piece_unmapped_at_the_map_count_limit_still_leaves(preload):
    """A cached piece between two live blocks of one mapping, trimmed while the program has used
    up vm.max_map_count: the split is refused, yet its pages leave RSS at once and the range
    goes once the program gives mappings back (Note [Unmaps the kernel refused]). Before, it
    stayed mapped and resident for good, out of every record."""
    count = int(open("/proc/sys/vm/max_map_count").read())
    if count > 1 << 18:
        pytest.skip(f"vm.max_map_count is {count}: the program could not use it up in a test's time")
    out = ok(run([compile_c("map_count")], preload=LIB if preload else False, timeout=120))
    assert "map count ok" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("which", [resource.RLIMIT_DATA, resource.RLIMIT_AS], ids=["data", "as"])
def test_live_blocks_under_a_mapping_limit_take_what_they_asked(preload, which):
    """Under a 400 MiB limit on what the process may map, 70 live blocks of 4 MiB and a page
    (280 MiB) fit, as under glibc alone. A huge-page block's length was a whole number of huge
    pages (6 MiB each): the 61st malloc failed."""
    def limit():
        resource.setrlimit(which, (400 << 20, 400 << 20))

    out = ok(run([compile_c("span_limit"), "70", str((4 << 20) + 4096)], preload=LIB if preload else False, preexec_fn=limit))
    assert "70 blocks live" in out.stdout, out.stdout


@pytest.mark.parametrize("how,says", [("pthread_exit", "exit handler ran\nmain left\n"), ("deep-handler", "exit handler ran\nmain left\n"),
                                      ("raw-exit", "raw left\n"), ("strict", "strict left\n")])
@pytest.mark.parametrize("preload", ["tensormalloc", "glibc"])
def test_a_process_ends_with_its_last_thread(how, says, preload):
    """Note [The last thread is the program's] (src/sys/reaper.rs): a main thread that ends by
    itself (pthread_exit, the exit system call, seccomp's strict mode) while our background
    thread runs; glibc ends the process with its last thread, and pthread_exit's exit(0) runs the
    exit handlers and flushes stdout. Before, our thread kept the process alive for good (SIGTERM
    could not end it either). An exit handler that needs 1 MiB of stack runs on the last thread:
    ours, whose stack was 256 KiB (SIGSEGV)."""
    out = run([compile_c("last_thread"), how], preload=LIB if preload == "tensormalloc" else False, timeout=20)
    assert out.returncode == 0, out
    assert out.stdout == says, out
    if preload == "tensormalloc":
        assert "threads 2" in out.stderr, f"our thread was not running: the case proves nothing\n{out}"


def test_a_block_freed_as_our_thread_ends_is_still_released():
    """Note [The last thread is the program's]: our thread ends when a pass finds nothing to do;
    a block freed at that moment (right after the last idle block expired) must still be released
    and unmapped. Before the fix the thread could go back to sleep with no deadline and never
    wake again: the block, and every one freed later, stayed cached and resident (4 of 5 runs,
    within 3 rounds)."""
    out = ok(run([compile_c("ending_race"), "12"], preload=LIB, env={"TENSORMALLOC_HOST_RELEASE_MS": "20", "TENSORMALLOC_HOST_UNMAP_MS": "50"}, timeout=120))
    assert "ending race ok" in out.stdout


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("which,op", [("as", "stack"), ("as", "sbrk"), ("data", "sbrk"), ("data", "mprotect")])
def test_room_freed_under_a_limit_is_there_for_what_we_never_see(preload, which, op):
    """Note [Room for others], rule 1: under a mapping limit the cache keeps nothing, since the
    kernel charges the stack's growth, brk and an mprotect to writable with no call of ours to
    retry (nor the loader's mappings, nor, under strict overcommit, other processes). 136 MiB
    left under 1 GiB, a 120 MiB block freed: before, with an eighth of the limit cached, the
    stack could not grow (SIGSEGV), sbrk and mprotect failed with ENOMEM (c/unseen_room.c)."""
    out = ok(run([compile_c("unseen_room"), which, op], preload=LIB if preload else False))
    assert f"room ok {op}" in out.stdout, out


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("mode,says", [("pthread-exit", "main leaves\natexit handler ran\n"), ("release", "released")], ids=["pthread-exit", "release"])
def test_a_vfork_child_that_frees_leaves_its_parent_whole(preload, mode, says):
    """Note [A child in our memory] (src/sys/reaper.rs): a vfork child that frees a large block
    made our thread, which died with the child and left the parent's words saying it ran.
    Before: the parent's main ending by pthread_exit no longer ended the process with its
    output and atexit handler (glibc counted the thread), and 256 MiB the parent freed stayed
    resident for good (c/vfork_child.c)."""
    env = {"TENSORMALLOC_HOST_RELEASE": "now", "TENSORMALLOC_HOST_RELEASE_MS": "100"}
    out = ok(run([compile_c("vfork_child"), mode], preload=LIB if preload else False, env=env, timeout=30))
    assert says in out.stdout, out


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_vfork_child_that_frees_then_execs_never_leaves_a_lock_held(preload):
    """The same child, exec'ing /bin/true after its free: the thread it made died in a pass
    holding the cache lock about one run in a hundred, and the parent's next malloc slept for
    good. 200 runs (c/vfork_child.c exec)."""
    binary = compile_c("vfork_child")
    for _ in range(200):
        out = ok(run([binary, "exec"], preload=LIB if preload else False, timeout=20))
        assert "exec ok" in out.stdout, out


def test_the_library_in_a_second_namespace_makes_its_thread_again():
    """dlmopen(LM_ID_NEWLM) of the library (c/second_namespace.c): three rounds of numpy-hook
    blocks, our thread ended and made again between them. Before, with 1.7 KiB of our
    thread-local storage, the second namespace's glibc freed TLS it had not allocated as the
    thread was made again (SIGSEGV), as it does for any library with that much."""
    env = {"TENSORMALLOC_HOST_RELEASE_MS": "100", "TENSORMALLOC_HOST_UNMAP_MS": "300"}
    out = ok(run([compile_c("second_namespace"), LIB], preload=False, env=env, timeout=60))
    assert "rounds 3" in out.stdout, out


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("case", ["fork-in-wait", "jump-out", "handler-mask"])
def test_what_a_handler_does_inside_our_work_is_the_programs(preload, case):
    """Note [Signals off our stack], c/handlers_in_our_work.c, found by a review of the first
    version (each failed there): a handler that forks while its thread waits inside a large
    realloc (the child's next use of our stack ran over the frames still live on it: every child
    aborted in pthread_create); a SIGSEGV handler that jumps out of a realloc's copy (every
    asynchronous signal stayed blocked for good); a handler that changes its thread's mask
    through its ucontext (the change was undone in about half the reallocs). glibc alone with
    its mmap threshold at 1 MiB (its realloc of those takes no lock; a fork inside one that does
    would deadlock under glibc too)."""
    argv = [compile_c("handlers_in_our_work"), case] + ([] if case == "jump-out" else ["3"])
    out = ok(run(argv, preload=LIB if preload else False, env={"MALLOC_MMAP_THRESHOLD_": "1048576"}, timeout=60))
    if case == "fork-in-wait":
        forks, ok_children, killed, lost = map(int, re.match(r"forks (\d+): children ok (\d+), killed (\d+), lost data (\d+)", out.stdout).groups())
        assert ok_children == forks and killed == lost == 0 and (forks > 0 or not preload), out
    elif case == "jump-out":
        assert out.stdout == "blocked after the jump: SIGALRM 0 SIGTERM 0\nSIGALRM taken\n", out
    else:
        changed, lost = map(int, re.match(r"handler changed the mask (\d+) times, lost (\d+)", out.stdout).groups())
        assert changed > 0 and lost == 0, out


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_conservative_collector_finds_every_live_object(preload):
    """Note [Signals off our stack], c/boehm_gc.c: Boehm GC (Debian's libgc, scripts/setup) with
    worker threads whose objects are referenced only from their stacks, growing large buffers by
    realloc while a thread collects all the time. When a pause landed while a worker ran on our
    stack, the collector scanned from there: tens of thousands of live objects were collected and
    reused in a 2 s run (a segfault in the marker in others), where glibc alone broke none."""
    out = ok(run([compile_c("boehm_gc", extra=["-lgc"]), "3", "2"], preload=LIB if preload else False, timeout=60))
    iterations, collections, broken = map(int, re.match(r"iterations (\d+) collections (\d+) broken (\d+)", out.stdout).groups())
    assert iterations > 0 and collections > 10 and broken == 0, out


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("case", ["stop-world", "deep-handler", "born-blocked"])
def test_signals_that_arrive_inside_our_work_are_the_programs(preload, case):
    """Note [Signals off our stack] (src/sys/stack.rs), c/signals_in_our_work.c. A stop-the-world
    collector (Boehm GC's, Mono's way: each thread paused in a signal handler that scans from its
    stack pointer) over workers that grow blocks and map pages beside them: the pause handler
    ran on our stack about once in 40 pauses before, and with the program's signals held there
    throughout, a worker waiting for the cache lock never took the pause, and the collector
    waited for good (stuck in 4 of 4 runs). A timer handler using 512 KiB of stack, arriving
    while a large realloc ran on our stack: it ran there (on a 256 KiB one, SIGSEGV past its
    guard page); now every handler runs on its thread's stack. A timer's SIGALRM while our thread
    was being made: taken by our thread, with the program's handler, in about one child of 25
    (Note [Born with signals blocked] in src/sys/thread.rs)."""
    argv = [compile_c("signals_in_our_work"), case] + {"stop-world": ["1500"], "born-blocked": ["300"]}.get(case, [])
    out = ok(run(argv, preload=LIB if preload else False, timeout=120))
    if case == "stop-world":
        assert "stopped the world 1500 times, paused off the thread's stack 0" in out.stdout, out
    elif case == "born-blocked":
        assert out.stdout == "children 300, handled elsewhere 0\n", out
    else:
        handled, elsewhere = map(int, re.match(r"handled (\d+), off the thread's stack (\d+)", out.stdout).groups())
        assert handled > 0 and elsewhere == 0, out


@pytest.mark.parametrize("setting", ["stats-text", "defaults", "glibc"])
@pytest.mark.parametrize("first", ["realloc", "free"])
def test_a_forked_childs_first_large_call_leaves_its_signals_open(first, setting):
    """c/fork_first_realloc.c: a child's first large call is a realloc (or free) of a block it
    inherited, then it sends itself SIGTERM, and dies by it, as under glibc alone. Under
    TENSORMALLOC_STATS=1 the realloc (quiet work on our stack) claimed the child's report file on
    our stack and started our thread from there: the nested switch left every asynchronous
    signal blocked for good (a review's find; a Pool's terminate() then waited on the worker)."""
    env = {"TENSORMALLOC_STATS": "1"} if setting == "stats-text" else {}
    out = ok(run([compile_c("fork_first_realloc"), first], preload=False if setting == "glibc" else LIB, env=env, timeout=60))
    assert "child: SIGTERM blocked=0" in out.stdout and "child killed by signal 15" in out.stdout, (out.stdout, out.stderr)
