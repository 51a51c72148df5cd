"""The stress program (c/stress.c) for a few seconds under several settings; the long soak run
is `scripts/soak MINUTES` (not in CI; its last result is in the README)."""
import pytest

from conftest import compile_c, ok, run
from test_host import SETTINGS


@pytest.mark.parametrize("setting", ["defaults", "pushed", "no-hugepages"])
def test_stress(setting):
    out = ok(run([compile_c("stress"), "4"], env=SETTINGS[setting], timeout=120))
    assert "stress ok" in out.stdout


def test_stress_over_jemalloc():
    from conftest import LIB, find_peer
    out = ok(run([compile_c("stress"), "3"], preload=f"{LIB} {find_peer('libjemalloc.so.2')}", timeout=120))
    assert "stress ok" in out.stdout
