"""What the library says, as a user reads it: an out-of-range setting's warning names the range
the setting allows, the report's counts agree in number ("1 block") and its %tot column is
explained under the table; the settings' one vocabulary (issue 37, Note [One vocabulary] in
src/config/options.rs): earlier names still read, with one line naming the new; off in many spellings;
US and UK spellings; the nearest setting named for a near miss."""
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


def test_earlier_names_still_work_with_one_line_naming_the_new():
    """Issue 37's renames: the old names are read as the new ones, each with one stderr line."""
    env = {"TENSORMALLOC_RELEASE_MS": "500", "TENSORMALLOC_EXPIRE_MS": "20000", "TENSORMALLOC_RELEASE": "dontneed",
           "TENSORMALLOC_LEAKS": "yes"}
    err = ok(run([compile_c("leaky")], env=env)).stderr
    lines = [l for l in err.splitlines() if " is now " in l]
    assert sorted(lines) == [
        "tensormalloc: TENSORMALLOC_EXPIRE_MS is now TENSORMALLOC_HOST_UNMAP_MS: read as that (the old name will go)",
        "tensormalloc: TENSORMALLOC_RELEASE is now TENSORMALLOC_HOST_RELEASE: read as that (the old name will go)",
        "tensormalloc: TENSORMALLOC_RELEASE_MS is now TENSORMALLOC_HOST_RELEASE_MS: read as that (the old name will go)",
    ], err
    assert "leaks at exit" in err  # yes means on
    # A bad value under an old name says both names.
    err = ok(run([compile_c("leaky")], env={"TENSORMALLOC_EXPIRE_MS": "soon"})).stderr
    assert ("tensormalloc: TENSORMALLOC_EXPIRE_MS='soon' is not a number of milliseconds; using the default 10000 "
            "(TENSORMALLOC_EXPIRE_MS is now TENSORMALLOC_HOST_UNMAP_MS)") in err, err


def test_off_is_one_word_with_many_spellings_and_both_spellings_of_neighbour():
    for word in ("off", "0", "no", "none", "false", "NONE"):
        err = ok(run([compile_c("leaky")], env={"TENSORMALLOC_LEAKS": word, "TENSORMALLOC_CUDA_LIMIT": word,
                                                "TENSORMALLOC_CUDA_NEIGHBOR_WAIT_MS": word})).stderr
        assert "tensormalloc:" not in err, (word, err)
    err = ok(run([compile_c("leaky")], env={"TENSORMALLOC_CUDA_NEIGHBOR_WAIT_MS": "250",
                                            "TENSORMALLOC_CUDA_NEIGHBOUR_WAIT_MS": "250"})).stderr
    assert "tensormalloc:" not in err, err


def test_a_near_miss_names_the_nearest_setting():
    err = ok(run([compile_c("leaky")], env={"TENSORMALLOC_STAT": "1", "TENSORMALLOC_CUDA_RELEASE": "100"})).stderr
    assert "TENSORMALLOC_STAT is not a tensormalloc setting; ignored (did you mean TENSORMALLOC_STATS?)" in err, err
    assert "TENSORMALLOC_CUDA_RELEASE is not a tensormalloc setting; ignored (did you mean TENSORMALLOC_CUDA_RELEASE_MS?)" in err, err


def test_a_name_set_beside_its_earlier_name_wins_with_one_line(tmp_path):
    """Both names of a setting in the environment: the name's value, whatever their order (it
    was the order of environ), one line for the earlier name; an empty value under either is
    the variable unset (it wiped the other's value). A path setting given a word for on writes
    no file named `1` (it wrote one)."""
    for env in ({"TENSORMALLOC_HOST_RELEASE_MS": "5000", "TENSORMALLOC_RELEASE_MS": "200"},
                {"TENSORMALLOC_RELEASE_MS": "200", "TENSORMALLOC_HOST_RELEASE_MS": "5000"}):
        err = ok(run([compile_c("leaky")], env={**env, "TENSORMALLOC_STATS": "1"})).stderr
        lines = [l for l in err.splitlines() if "RELEASE_MS" in l]
        assert lines == ["tensormalloc: TENSORMALLOC_RELEASE_MS is now TENSORMALLOC_HOST_RELEASE_MS, which is set too: "
                         "TENSORMALLOC_RELEASE_MS ignored, TENSORMALLOC_HOST_RELEASE_MS used"], err
    err = ok(run([compile_c("leaky")], env={"TENSORMALLOC_HOST_RELEASE_MS": "", "TENSORMALLOC_RELEASE_MS": "200"})).stderr
    assert [l for l in err.splitlines() if "RELEASE_MS" in l] == [
        "tensormalloc: TENSORMALLOC_RELEASE_MS is now TENSORMALLOC_HOST_RELEASE_MS: read as that (the old name will go)"], err
    err = ok(run([compile_c("leaky")], env={"TENSORMALLOC_TRACE": "1"}, cwd=str(tmp_path))).stderr
    assert "TENSORMALLOC_TRACE='1' is on, where a path (the file to write) is wanted; using the default off" in err, err
    assert list(tmp_path.iterdir()) == [], "no file named 1"
