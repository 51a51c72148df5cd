"""C++ operator new/delete under the preload, alone and layered over each peer that exports its
own operators (jemalloc, tcmalloc, mimalloc): large `new` is served by the cache in every
layering, small news and failures go to the next operator, contents survive."""
import json

import pytest

from conftest import BUILD, LIB, compile_c, compile_cxx, find_peer, ok, run

PEERS = {
    "alone": None,
    "jemalloc": "libjemalloc.so.2",
    "tcmalloc": "libtcmalloc_minimal.so.4",
    "mimalloc": "libmimalloc.so.2",
}


def preload(peer):
    return str(LIB) if PEERS[peer] is None else f"{LIB} {find_peer(PEERS[peer])}"


@pytest.mark.parametrize("peer", PEERS)
def test_large_new_is_served_by_the_cache(peer, tmp_path):
    path = tmp_path / "stats.json"
    out = ok(run([compile_cxx("cxx_new")], preload=preload(peer), env={"TENSORMALLOC_STATS": f"json:{path}"}))
    assert "cxx servable ok" in out.stdout
    host = json.loads(path.read_text())["host"]
    # 200 churn blocks, vector buffers, aligned and nothrow ones: before interposing operator
    # new, a layered run saw none of them.
    assert host["requests"] >= 200, host
    assert host["hits"] >= 0.95 * host["requests"], host


@pytest.mark.parametrize("peer", PEERS)
def test_impossible_nothrow_new_gives_nullptr(peer):
    out = ok(run([compile_cxx("cxx_new"), "nothrow-fail"], preload=preload(peer)))
    assert "cxx nothrow-fail ok" in out.stdout


@pytest.mark.parametrize("mode", ["throw-fail", "small-fail"])
@pytest.mark.parametrize("peer", PEERS)
def test_failing_throwing_new_does_what_the_next_operator_does(peer, mode):
    """An impossible size (large) or small news past RLIMIT_AS: the new_handler runs, then
    bad_alloc (libstdc++, jemalloc, tcmalloc); mimalloc 2.0 aborts on its own too: the outcome
    must be the next allocator's, with or without us."""
    exe = compile_cxx("cxx_new")
    ours = run([exe, mode], preload=preload(peer))
    theirs = run([exe, mode], preload=find_peer(PEERS[peer]) if PEERS[peer] else False)
    assert ours.returncode == theirs.returncode, (ours, theirs)
    assert ours.stdout == theirs.stdout
    if peer != "mimalloc":
        assert f"cxx {mode} ok" in ok(ours).stdout


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_large_new_that_does_not_fit_is_served_by_the_next_operator_unreported(preload):
    """Large news of every form under RLIMIT_AS 200 MiB over what is mapped, with 600 MiB of
    glibc's heap freed: all served from that heap, as under glibc alone, and no out-of-memory
    report (Note [Out of memory behind operator new]). Before, each throwing new we could not map
    printed a report before libstdc++'s operator served it."""
    out = ok(run([compile_cxx("cxx_new"), "next-room"], preload=LIB if preload else False))
    assert "new: 75 of 75, nothrow: 75 of 75, aligned: 75 of 75, aligned nothrow: 75 of 75" in out.stdout, out.stdout + out.stderr
    assert "out of memory" not in out.stderr, out.stderr


def test_disabled_passes_every_operator_through(tmp_path):
    path = tmp_path / "stats.json"
    env = {"TENSORMALLOC_DISABLE": "1", "TENSORMALLOC_STATS": f"json:{path}", "CXX_CHURN": "20"}
    out = ok(run([compile_cxx("cxx_new")], preload=preload("jemalloc"), env=env))
    assert "cxx servable ok" in out.stdout
    assert json.loads(path.read_text())["host"]["requests"] == 0
    for mode in ("nothrow-fail", "throw-fail"):
        ok(run([compile_cxx("cxx_new"), mode], env={"TENSORMALLOC_DISABLE": "1"}))


def test_cxx_library_loaded_with_rtld_local(tmp_path):
    """Python loads extensions with RTLD_LOCAL: their libstdc++ is out of RTLD_NEXT's reach, and
    the next operator is found as the copy already loaded (large news cached, bad_alloc thrown)."""
    path = tmp_path / "stats.json"
    exe = compile_c("cxx_local_main")
    out = ok(run([exe, compile_cxx("cxx_local", shared=True)], env={"TENSORMALLOC_STATS": f"json:{path}"}))
    assert "cxx local ok" in out.stdout
    host = json.loads(path.read_text())["host"]
    assert host["requests"] >= 20 and host["hits"] >= 19, host


@pytest.mark.parametrize("peer", PEERS)
def test_operators_the_program_replaced_are_the_ones_every_form_calls(peer):
    """Note [Operators the program replaced]: a program defines only operator new(size_t) and
    operator delete(void*), with a header before each block; every other form must reach them, as
    libstdc++'s do, also with a peer layered after us (the peers alone call their own: jemalloc
    counts 5 news and no delete). Before, our sized and array forms freed the program's pointers
    themselves: deletes went uncounted, and free() of a pointer past the header aborted."""
    exe = compile_cxx("cxx_replaced")
    ours = ok(run([exe], preload=preload(peer)))
    alone = ok(run([exe], preload=False))
    assert alone.stdout == "news=11 deletes=11 headers ok\n", alone.stdout
    if peer == "tcmalloc":
        # tcmalloc, first reached after the program began, makes two objects of its own with the
        # program's new and keeps them: its news, not the program's forms.
        assert ours.stdout == "news=13 deletes=11 headers ok\n", (ours.stdout, ours.stderr)
    else:
        assert ours.stdout == alone.stdout, (ours.stdout, ours.stderr)


@pytest.mark.parametrize("how", ["linked", "preloaded-after-us", "symbolic"])
def test_operators_a_library_behind_us_replaced_are_the_ones_every_form_calls(how):
    """The same two operators in a library behind us (Note [Operators the program replaced]):
    linked by the program, preloaded after us (a leak counter layered over tensormalloc), or
    bound inside itself by -Bsymbolic-functions; blocks cross between the library's own calls
    and the program's. Before, a sized or array delete went straight to free past the library's
    header (`free(): invalid pointer`), and a large block the library's new got from us and the
    program deleted was refused as an interior pointer."""
    symbolic = how == "symbolic"
    suffix = "_sym" if symbolic else ""
    lib = compile_cxx("cxx_replaced", shared=True, as_name=f"libcxx_replaced{suffix}",
                      extra=["-DOPERATORS_ONLY", *(["-Wl,-Bsymbolic-functions"] if symbolic else [])])
    exe = compile_cxx("cxx_replaced", as_name=f"cxx_replaced_main{suffix}",
                      extra=["-DMAIN_ONLY", f"-L{BUILD}", f"-lcxx_replaced{suffix}", f"-Wl,-rpath,{BUILD}"])
    alone = ok(run([exe], preload=False))
    assert alone.stdout == "news=13 deletes=13 headers ok\n", alone.stdout
    ours = ok(run([exe], preload=f"{LIB} {lib}" if how == "preloaded-after-us" else True))
    assert ours.stdout == alone.stdout, (ours.stdout, ours.stderr)


def test_a_cxx_runtime_loaded_after_new_was_first_called_throws_for_it():
    """A C program loads a plugin built with a static libstdc++ (its operators exported: the
    process's first new found no C++ runtime behind us), then one on the shared libstdc++ whose
    impossible new must run its new_handler and throw std::bad_alloc. Before, the first answer
    was kept: one line and an abort."""
    first = compile_cxx("cxx_runtime_late", shared=True, as_name="libcxx_static_runtime", extra=["-DSTATIC_RUNTIME", "-static-libstdc++"])
    second = compile_cxx("cxx_runtime_late", shared=True, as_name="libcxx_shared_runtime")
    exe = compile_c("cxx_runtime_late_main")
    expected = "static runtime: 1000\nbad_alloc, handler calls 1\nbad_alloc again\n"
    alone = ok(run([exe, first, second], preload=False))
    assert alone.stdout == expected, alone.stdout
    ours = ok(run([exe, first, second]))
    assert ours.stdout == expected, (ours.stdout, ours.stderr)
