"""glibc's own names (__libc_malloc, __libc_free, ...) called directly, mixed with the plain
ones: a block is freed by its owner whichever name frees it (Note [glibc's own names] in
src/route/libc_names.rs). Beside glibc alone, and with tcmalloc (which defines those names too)
behind us. Not over jemalloc: Debian's jemalloc alone aborts on this program (glibc's free() reports an
invalid pointer), and so it does behind us, no worse."""
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
