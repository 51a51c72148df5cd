"""Every example in README.md runs as written: its code blocks, in order, in a copy of the checkout
(a fresh clone's files), with a home directory of its own (so `~/.local` is a fresh prefix for
scripts/install) and the `.venv` that scripts/setup makes; the README's own pip block makes the
fresh venv the later blocks use. Needs PyPI (numpy, matplotlib), as test_package.py does.

A block's info string says what it is: ```sh, ```python, ```c (run or compiled as the README
says); `file=NAME` writes the block to NAME instead of running it; ```text is output or a
layout; `notest=REASON` is not run (Python ones are still compiled). Any other language fails
the test, so a new block is either run or marked."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, ok

README = ROOT / "README.md"
FENCE = re.compile(r"^```(\S*)(.*?)\n(.*?)^```\s*$", re.M | re.S)
RUNNABLE = {"sh", "python", "c"}


def blocks():
    """(line, language, options, body) of every fenced block, in order."""
    text = README.read_text()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        lang, rest = m.group(1), m.group(2).strip()
        opts = {}
        for key in ("file", "notest"):
            found = re.search(rf"\b{key}=(.*)$" if key == "notest" else rf"\b{key}=(\S+)", rest)
            if found:
                opts[key] = found.group(1).strip()
        out.append((line, lang, opts, m.group(3)))
    return out


BLOCKS = blocks()


def block_id(b):
    line, lang, opts, body = b
    return f"line{line}-{lang}" + (f"-{opts['file']}" if "file" in opts else "")


def test_every_block_says_what_it_is():
    assert len(BLOCKS) >= 10
    for line, lang, opts, body in BLOCKS:
        assert lang in RUNNABLE | {"text"}, f"README line {line}: ```{lang}: mark it sh/python/c (run) or text (not run)"
        if "notest" in opts:
            assert len(opts["notest"]) > 10, f"README line {line}: notest needs a reason"
    excluded = [b for b in BLOCKS if "notest" in b[2]]
    assert len(excluded) <= 3, f"keep the blocks not run few: {[b[0] for b in excluded]}"


def real(var, default):
    return os.environ.get(var) or str(Path.home() / default)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """Runs every runnable block in order; returns {line: CompletedProcess}."""
    tmp = tmp_path_factory.mktemp("readme")
    clone = tmp / "clone"
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, listed):
        if (ROOT / f).is_file():
            (clone / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, clone / f)
    # What scripts/setup leaves in a clone: the .venv; and cargo's output kept across sessions
    # (incremental builds) in a directory of its own inside this checkout's target/.
    (clone / ".venv").symlink_to(ROOT / ".venv")
    cache = ROOT / "target" / "readme"
    cache.mkdir(parents=True, exist_ok=True)
    (clone / "target").symlink_to(cache)
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TENSORMALLOC_") and k not in ("LD_PRELOAD", "PYTHONPATH", "VIRTUAL_ENV", "PKG_CONFIG_PATH")}
    # A home of its own (so ~/.local is a fresh prefix); Rust's and pip's caches stay the user's.
    env.update(HOME=str(home), CARGO_HOME=real("CARGO_HOME", ".cargo"), RUSTUP_HOME=real("RUSTUP_HOME", ".rustup"),
               PIP_CACHE_DIR=real("PIP_CACHE_DIR", ".cache/pip"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    results = {}
    for line, lang, opts, body in BLOCKS:
        if lang not in RUNNABLE or "notest" in opts:
            continue
        if "file" in opts:
            (clone / opts["file"]).write_text(body)
            continue
        if lang == "sh":
            argv = ["bash", "-e", "-o", "pipefail", "-c", body]
        elif lang == "python":
            assert (clone / "venv" / "bin" / "python").exists(), f"line {line}: no venv yet (the pip block makes it)"
            argv = [str(clone / "venv" / "bin" / "python"), "-c", body]
        else:
            raise AssertionError(f"README line {line}: a ```c block must name its file (file=prog.c)")
        results[line] = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    return results


RUN = [b for b in BLOCKS if b[1] in RUNNABLE and "notest" not in b[2] and "file" not in b[2]]


@pytest.mark.parametrize("block", RUN, ids=block_id)
def test_block_runs_as_written(readme_run, block):
    line, lang, opts, body = block
    out = ok(readme_run[line])
    if "./a.out" in body:
        assert "10 large requests, 9 hits" in out.stdout, out.stdout      # what the README's comment says
    if "epoch.py" in body:
        allocated, peak, live = map(int, out.stdout.split()[:3])
        assert allocated >= 10 * 80_000_000 and live >= 2 * 80_000_000, out.stdout
    if "TENSORMALLOC_STATS=1" in body:
        assert "tensormalloc 0.1.0 report" in out.stderr, out.stderr
    if "plot trace.bin" in body:
        assert "wrote trace.bin.png" in out.stdout, out.stdout
    if "pool.py" in body:
        total = next(l for l in out.stdout.splitlines() if l.split()[:1] == ["total"]).split()
        # Two workers, 50 arrays each, all but the first a hit; Python's own blocks of 128 KiB and
        # more (spawning a worker imports numpy) come on top, and the parent and the resource
        # tracker make some too.
        assert int(total[1]) >= 2 and total[2] == "processes" and int(total[3]) >= 100 and int(total[4]) >= 98, out.stdout
        assert "wrote run.png" in out.stdout, out.stdout


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] == "python" and "notest" in b[2]], ids=block_id)
def test_python_blocks_not_run_still_compile(block):
    compile(block[3], f"README.md:{block[0]}", "exec")
