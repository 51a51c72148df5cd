"""glibc's own names (__libc_malloc, __libc_free, ...) called directly, mixed with the plain
ones: a block is freed by its owner whichever name frees it (Note [glibc's own names] in
src/route/libc_names.rs). Beside glibc alone, and with tcmalloc (which defines those names too)
behind us. Not over jemalloc: Debian's jemalloc alone aborts on this program (glibc's free() reports an
invalid pointer), and so it does behind us, no worse."""
import os
import shutil
import subprocess

import pytest

from conftest import BUILD, C_DIR, LIB, compile_c, compile_cxx, find_peer, ok, run


@pytest.mark.parametrize("setting", ["tensormalloc", "glibc", "threshold-64K"])
def test_libc_names(setting):
    env = {"TENSORMALLOC_THRESHOLD": "64K"} if setting == "threshold-64K" else {}
    out = ok(run([compile_c("libc_names")], preload=setting != "glibc", env=env))
    assert "libc names ok" in out.stdout


def test_libc_names_over_a_peer_that_defines_them():
    peer = find_peer("libtcmalloc_minimal.so.4")
    ok(run([compile_c("libc_names")], preload=peer))
    out = ok(run([compile_c("libc_names")], preload=f"{LIB}:{peer}"))
    assert "libc names ok" in out.stdout


@pytest.mark.parametrize("setting", ["tensormalloc", "glibc", "two-copies"])
def test_calls_through_libcs_handle_reach_us(setting, tmp_path):
    """Note [Calls through a library's handle]: free, realloc, malloc_usable_size and mprotect
    looked up through libc's handle (ctypes.CDLL("libc.so.6")) act on our large blocks as they
    do by symbol. Before, free and realloc crashed on them, and a block protected that way came
    back read-only. Two copies of the library preloaded (a launcher's own before the user's):
    libc's handle handed out glibc's definitions, past both (SIGSEGV, `free(): invalid pointer`)."""
    preload = {"tensormalloc": True, "glibc": False}.get(setting)
    if setting == "two-copies":
        second = tmp_path / "copy" / "libtensormalloc.so"
        second.parent.mkdir()
        shutil.copy(LIB, second)
        preload = f"{LIB} {second}"
    out = ok(run([compile_c("libc_handle")], preload=preload))
    assert "libc handle ok" in out.stdout


@pytest.mark.parametrize("peer", ["libjemalloc.so.2", "libtcmalloc_minimal.so.4", "libmimalloc.so.2"])
def test_an_allocator_in_front_of_us_gets_its_own_blocks_back(peer):
    """Note [An allocator in front of us]: LD_PRELOAD="PEER libtensormalloc.so" (a container's
    global setting with ours appended). reallocarray and free_sized, which the peers lack, reach
    us for the peer's blocks and go to its realloc and free, as glibc's would. Before, they went
    on to glibc's: this program aborted, and `ls -l` crashed."""
    front = f"{find_peer(peer)} {LIB}"
    out = ok(run([compile_c("front")], preload=front))
    assert "front ok" in out.stdout
    alone = ok(run(["ls", "-l", "/usr/include"], preload=find_peer(peer)))
    assert ok(run(["ls", "-l", "/usr/include"], preload=front)).stdout == alone.stdout


def test_a_locking_tracer_in_front_of_us_never_waits_on_itself():
    """Note [No thread inside another allocator's call]: a tracer in front of us calls our free
    under its plain mutex; glibc's pthread_create, making our thread there, called the tracer's
    calloc, which waited on that mutex for good. Large blocks churned by two threads: the program
    ends, the tracer saw the calls, and no freed block stayed resident (nothing is cached without
    our thread)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    tracer = BUILD / "liblocking_tracer.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-pthread", "-o", str(tracer), str(C_DIR / "locking_tracer.c"), "-ldl"], check=True)
    out = ok(run([compile_c("tracer_front")], preload=f"{tracer} {LIB}", timeout=60))
    assert "locking tracer:" in out.stdout, out.stdout
    rss_mb = int(out.stdout.split("rss MB ")[1].split()[0])
    assert rss_mb < 32, out.stdout


@pytest.mark.parametrize("library", ["loaded late", "absent"])
def test_a_copy_loaded_late_hands_out_no_block_through_operator_new(library):
    """Note [A copy the process does not allocate through] (src/sys/front.rs), c/late_copy.c: the
    library dlopened RTLD_GLOBAL after the program started (no preload), between two C++ plugins
    loaded RTLD_LOCAL. The later plugin's operator new[] of 64 MiB found ours first, and the
    earlier plugin's delete[] (libstdc++'s, into glibc's free) crashed on our block (SIGSEGV);
    now ours passes it on to libstdc++'s."""
    argv = [compile_c("late_copy"), compile_cxx("late_copy_delete", shared=True), str(LIB) if library == "loaded late" else "none", compile_cxx("late_copy_new", shared=True)]
    out = ok(run(argv, preload=False))
    assert out.stdout == "done\n", out


@pytest.mark.parametrize("library", ["loaded late", "absent"])
def test_a_copy_loaded_late_hands_out_no_block_through_cuda_malloc(library):
    """As above, with two plugins linked with the stand-in runtime (c/late_copy_cuda_*.c): the
    later one's cudaMalloc found ours first, and the earlier one's cudaFree (the runtime's)
    refused our pooled block (1, invalid value) and it was lost; now it is the runtime's block."""
    from cudasim import cuda_plugin, fake_cuda
    argv = [compile_c("late_copy"), cuda_plugin("late_copy_cuda_free", runtime=True), str(LIB) if library == "loaded late" else "none", cuda_plugin("late_copy_cuda_alloc", runtime=True)]
    # The stand-in runtime finds the stand-in driver as NVIDIA's finds its: by the library path.
    out = ok(run(argv, preload=False, env={"LD_LIBRARY_PATH": str(fake_cuda())}))
    assert out.stdout == "done\n", out


MALLOC_DEBUG = next((p for p in ["/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0", "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0",
                                 "/usr/lib64/libc_malloc_debug.so.0"] if os.path.exists(p)), None)


@pytest.mark.skipif(MALLOC_DEBUG is None, reason="glibc's libc_malloc_debug.so.0 (glibc 2.34 and later) is not installed")
@pytest.mark.parametrize("order", ["debug-first", "tensormalloc-first"])
@pytest.mark.parametrize("check", ["MALLOC_CHECK_=3", "mcheck", "none"])
def test_glibc_malloc_debugging_sees_every_block(order, check):
    """Note [Memory debuggers], Note [Versioned interposers]: glibc's malloc debugging library
    preloaded before or after us. Its functions are compat symbols a plain dlsym skips, and it
    reads glibc's chunk headers around every block. Before: in front of us its
    malloc_usable_size of a large block crashed (SIGSEGV), and under MALLOC_CHECK_=3 its free
    aborted on our reallocarray's blocks (`ls` too); behind us mprobe of a valid block aborted.
    Now we step aside with one line, and every block is glibc's, checked as without us."""
    env = {"MALLOC_CHECK_": "3"} if check == "MALLOC_CHECK_=3" else {}
    argv = [compile_c("malloc_debug")] + (["mcheck"] if check == "mcheck" else [])
    alone = ok(run(argv, preload=MALLOC_DEBUG, env=env))
    assert alone.stdout == "ok\n"
    both = f"{MALLOC_DEBUG} {LIB}" if order == "debug-first" else f"{LIB} {MALLOC_DEBUG}"
    out = ok(run(argv, preload=both, env=env))
    assert out.stdout == "ok\n"
    assert out.stderr.count("tensormalloc steps aside") == 1, out.stderr
    if check == "MALLOC_CHECK_=3":
        ok(run(["ls", "/usr/lib"], preload=both, env=env))


def test_a_program_that_takes_mallocs_address_is_not_an_allocator_in_front():
    """Note [A program that takes malloc's address] (src/sys/dlsym.rs), c/plt_address.c built
    without PIE: its canonical PLT entries for malloc, realloc and free, which dlsym answers, were
    taken for an allocator in front of us; our thread was never made and nothing stayed cached
    (Debian's node ran 3 to 4 times slower than under glibc alone: the runtimes hunter)."""
    binary = compile_c("plt_address", extra=["-fno-pic", "-no-pie"])
    assert ok(run([binary, "glibc"], preload=False)).stdout == "ran\n"
    out = ok(run([binary]))
    assert out.stdout == "cached 20, thread yes\n", out


MEMUSAGE = next((p for p in ["/usr/lib/x86_64-linux-gnu/libmemusage.so", "/lib/x86_64-linux-gnu/libmemusage.so"] if os.path.exists(p)), None)


def tracer_library(name):
    BUILD.mkdir(parents=True, exist_ok=True)
    out = BUILD / f"lib{name}.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(out), str(C_DIR / f"{name}.c"), "-ldl"], check=True)
    return str(out)


@pytest.mark.parametrize("tracer", ["header-tracer", "memusage"])
def test_a_tracer_in_front_sees_cxx_and_aligned_blocks(tracer):
    """LD_PRELOAD="TRACER libtensormalloc.so" with a tracer that adds a header to each block and
    lacks the C++ operators and the aligned names (glibc's memusage, which heaptrack-style
    launchers put in front of an LD_PRELOAD they find). Before: libstdc++'s shortcut freed the
    tracer's blocks, past its header, into glibc's free (`munmap_chunk(): invalid pointer`), and
    it saw none of the program's news; an aligned block of ours, freed through the tracer's free,
    which reads the 16 bytes before it, crashed where it started a mapping. Now C++ goes through
    libstdc++'s operators to the tracer and aligned requests to glibc, as without us, and the
    tracer counts what it counts alone (the glibc-tools hunter)."""
    assert MEMUSAGE, "glibc's libmemusage.so ships with libc6"
    front = MEMUSAGE if tracer == "memusage" else tracer_library("header_tracer")
    binary = compile_cxx("front_cxx")
    alone = ok(run([binary], preload=front))
    out = ok(run([binary], preload=f"{front} {LIB}"))
    assert "front cxx ok" in out.stdout, out
    if tracer == "header-tracer":
        assert out.stdout == alone.stdout, (out.stdout, alone.stdout)


@pytest.mark.parametrize("behind", ["handle-hook", "header-tracer", "memusage"])
def test_a_hook_behind_us_is_called_as_without_us(behind):
    """LD_PRELOAD="libtensormalloc.so HOOK". A hook that finds "the real" malloc and mmap through
    libc's handle was answered with ours (Note [Calls through a library's handle]), which calls
    the next, the hook's: the stack ran out (SIGSEGV, even with TENSORMALLOC_DISABLE=1). A small
    block realloc'd past the threshold was sized with glibc's malloc_usable_size where the next
    malloc, a tracer's, adds a header (memusage): a garbage size, SIGSEGV in the copy. Now the
    hook gets libc's own and the copy asks the tracer's realloc (the glibc-tools hunter)."""
    assert MEMUSAGE, "glibc's libmemusage.so ships with libc6"
    hook = {"handle-hook": lambda: tracer_library("handle_hook"), "header-tracer": lambda: tracer_library("header_tracer"), "memusage": lambda: MEMUSAGE}[behind]()
    binary = compile_c("behind_us")
    for env in [{}, {"TENSORMALLOC_DISABLE": "1"}]:
        out = ok(run([binary], preload=f"{LIB} {hook}", env=env))
        assert "behind us ok" in out.stdout, out
