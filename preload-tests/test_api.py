"""The C API (include/tensormalloc.h) at its edges: called from a signal handler that landed in
our own work (Note [The API inside our own work] in src/shim/api.rs, Note [Scopes in a signal
handler] in src/record/scopes.rs), the switch turned off with blocks live, under
TENSORMALLOC_DISABLE, and errno across a snapshot."""
import pytest

from conftest import compile_c, ok, run

HANDLER_MODES = ["stats", "holders", "trim", "set-enabled", "print-stats", "snapshot", "scope"]


@pytest.mark.parametrize("mode", HANDLER_MODES)
@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_api_calls_from_a_signal_handler_never_wait_for_our_own_work(mode, preload):
    """A SIGALRM every 200 us over a large malloc/realloc/free loop, its handler calling one
    tm_* function: the old library hung for good in tm_get_stats, tm_get_holders, tm_trim and
    tm_set_enabled (the handler waited on the cache lock its own thread held)."""
    out = ok(run([compile_c("api_in_handler"), mode], preload=preload, timeout=60))
    assert f"{mode} ok" in out.stdout, out.stdout
    if preload and mode in ("stats", "holders"):
        # Outside our work the call answers as anywhere.
        answered = int(out.stdout.split("answered ")[1].split(",")[0])
        assert answered > 0, out.stdout


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_scope_in_a_signal_handler_leaves_the_threads_own_whole(preload):
    """The main thread opens and closes a scope every turn while the handler opens and closes
    one of its own: the old library's handler, finding itself outermost, unmapped the page the
    interrupted begin then wrote (SIGSEGV)."""
    out = ok(run([compile_c("api_in_handler"), "scope", "scoped"], preload=preload, timeout=60))
    assert "scope ok" in out.stdout, out.stdout


def test_blocks_freed_while_the_cache_is_off_go_back_to_the_system():
    """tm_set_enabled(0) with 512 MiB live, then every block freed: the old library cached them
    all (held about 10 s, though no request could take them)."""
    out = ok(run([compile_c("api_edges"), "off-frees"], env={"TENSORMALLOC_HOST_RELEASE_MS": "60000"}))
    assert "off-frees ok" in out.stdout, out.stdout


def test_under_disable_the_switch_stays_off():
    """TENSORMALLOC_DISABLE=1 is "as if not loaded" (for memory tools): the old library let
    tm_set_enabled(1) turn the cache on."""
    out = ok(run([compile_c("api_edges"), "disable-stays-off"], env={"TENSORMALLOC_DISABLE": "1"}))
    assert "disable-stays-off ok" in out.stdout, out.stdout


def test_a_snapshot_leaves_errno_as_the_program_left_it():
    out = ok(run([compile_c("api_edges"), "snapshot-errno"]))
    assert "snapshot-errno ok" in out.stdout, out.stdout
