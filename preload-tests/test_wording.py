"""What the library says, as a user reads it: an out-of-range setting's warning names the range
the setting allows, the report's counts agree in number ("1 block") and its %tot column is
explained under the table."""
from conftest import compile_c, ok, run


def test_out_of_range_setting_names_the_allowed_range():
    env = {"TENSORMALLOC_THRESHOLD": "1K", "TENSORMALLOC_CACHE_BLOCKS": "5000", "TENSORMALLOC_CUDA_LIMIT": "150%"}
    err = ok(run(["true"], env=env)).stderr
    assert "TENSORMALLOC_THRESHOLD='1K' is out of range (allowed: 4K to 1T); using the default 128K" in err, err
    assert "TENSORMALLOC_CACHE_BLOCKS='5000' is out of range (allowed: 0 to 1024); using the default auto" in err, err
    assert "TENSORMALLOC_CUDA_LIMIT='150%' is out of range (allowed: 1% to 100%)" in err, err


def test_report_counts_agree_in_number_and_explain_tot():
    # leaky.c leaves 3 blocks live and caches the one 32 MiB block it frees five times.
    out = ok(run([compile_c("leaky")], env={"TENSORMALLOC_STATS": "1", "TENSORMALLOC_LEAKS": "1"}))
    assert "cached 32.0 MiB in 1 block (" in out.stderr, out.stderr
    assert "1 blocks" not in out.stderr and "0 block," not in out.stderr, out.stderr
    assert "3 blocks still live" in out.stderr
    legend = [line for line in out.stderr.splitlines() if line.startswith(" %tot: ")]
    assert legend and "the unindented rows sum to 100%" in legend[0], out.stderr
