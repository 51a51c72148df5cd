"""Every example in README.md and in the docs pages a user follows runs as written, the way a
newcomer runs it (issue 37): in a fresh clone (the checkout's files, tracked and new, copied;
no .venv, no build), with a home directory of its own (so `~/.local` is a fresh prefix for
scripts/install) and, as "any python3 with numpy", a `python3` on PATH that is the .venv's
python (which scripts/setup makes) run from outside the checkout. Needs PyPI (numpy,
setuptools-rust), as test_package.py does.

- README.md, in order: the source build and the one line that runs a program under the library,
  the pip install into a venv of its own, the numpy section, the C section through
  `scripts/install --prefix ~/.local` and pkg-config;
- docs/install.md, after it, in the same clone (its pip block reinstalls into the README's venv
  and runs the README's train.py, its C block builds the README's prog.c against target/release);
- docs/observability.md and docs/several-processes.md, after it, with the README's venv first on
  PATH (its `tensormalloc` and `python3`, as a user who activated it);
- docs/pytorch.md's commands that need no GPU, with .venv-torch's python as `python3` (skipped,
  saying why, only where .venv-torch is missing).

A block's info string says what it is: ```sh, ```python, ```c (run or compiled as the page
says); `file=NAME` writes the block to NAME instead of running it; ```text is output or a
layout; `notest=REASON` is not run (Python ones are still compiled). Any other language fails
the test, so a new block is either run or marked. Beside the blocks: the README's length and
first screen, every link in the README and docs/ resolving, CI running the README's test
command, docs/verification.md naming every process test."""
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
# The pages whose blocks run, in order, and the PATH each runs with (see the docstring).
PAGES = {"README.md": "clone", "docs/install.md": "clone", "docs/observability.md": "venv",
         "docs/several-processes.md": "venv"}
TORCH_PAGE = "docs/pytorch.md"
TORCH_PYTHON = ROOT / ".venv-torch" / "bin" / "python"


def blocks(page):
    """(line, language, options, body) of every fenced block of a page, in order."""
    text = (ROOT / page).read_text()
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


ALL = [(page, *b) for page in [*PAGES, TORCH_PAGE] for b in blocks(page)]


def block_id(b):
    page, line, lang, opts, body = b
    return f"{Path(page).stem}-line{line}-{lang}" + (f"-{opts['file']}" if "file" in opts else "")


@pytest.mark.parametrize("page", [*PAGES, TORCH_PAGE])
def test_every_block_says_what_it_is(page):
    bs = blocks(page)
    assert bs, f"{page} has no blocks"
    for line, lang, opts, body in bs:
        assert lang in RUNNABLE | {"text"}, f"{page} line {line}: ```{lang}: mark it sh/python/c (run) or text (not run)"
        if "notest" in opts:
            assert len(opts["notest"]) > 10, f"{page} line {line}: notest needs a reason"
    excluded = [b[0] for b in bs if "notest" in b[2]]
    assert len(excluded) <= 3, f"{page}: keep the blocks not run few: {excluded}"


def test_readme_is_short_and_its_first_screen_installs_and_runs():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; depth goes to docs/"
    first = "\n".join(lines[:40])
    assert "cargo build --release" in first and "pip install" in first, "install, from source and with pip, in the first 40 lines"
    assert re.search(r"^scripts/tensormalloc python3 ", first, re.M), "one line running a program under it in the first 40 lines"
    near = "\n".join(lines[:50])
    assert "scripts/bench-numpy" in near and "scripts/test" in near, "the main job and the tests near the top"


def test_ci_runs_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [l.strip() for l in ci.splitlines() if l.strip() and not l.lstrip().startswith(("#", "set ", "cd "))]
    assert commands == ["scripts/test"], commands
    assert re.search(r"^scripts/test\b", README.read_text(), re.M), "the README names the command CI runs"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(md):
    """GitHub's anchors for a page's headings."""
    out = set()
    for h in re.findall(r"^#+ (.*)$", md.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_every_link_resolves(page):
    src = ROOT / page
    bad = []
    for target in LINK.findall(src.read_text()):
        if re.match(r"[a-z]+:", target):
            continue                                  # http(s): not checked offline
        path, _, anchor = target.partition("#")
        dest = (src.parent / path).resolve() if path else src
        if not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(target)
    assert not bad, f"{page}: links that lead nowhere: {bad}"


def test_readme_links_every_docs_page():
    text = README.read_text()
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if f"docs/{p.name}" not in text]
    assert not missing, missing


def test_verification_page_names_every_process_test():
    page = (ROOT / "docs" / "verification.md").read_text()
    # The line scripts/gpu-record rewrites from each GPU run (test_gpu_record.py).
    assert re.search(r"^\*\*Nothing since \d{4}-\d\d-\d\d has run on a GPU\.\*\* ", page, re.M), "the last GPU run, at the top"
    missing = [p.name for p in (ROOT / "preload-tests").glob("test_*.py") if p.name not in page]
    assert not missing, f"docs/verification.md: where does what these test last run? {missing}"


def real(var, default):
    return os.environ.get(var) or str(Path.home() / default)


def wrapper(bindir, python):
    """A `python3` on PATH that is `python`, run by path (a symlink would lose its venv)."""
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / "python3").write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    (bindir / "python3").chmod(0o755)
    return str(bindir)


def run_blocks(page, clone, env):
    results = {}
    for line, lang, opts, body in blocks(page):
        if lang not in RUNNABLE or "notest" in opts:
            continue
        if "file" in opts:
            (clone / opts["file"]).write_text(body)
            continue
        if lang == "sh":
            argv = ["bash", "-e", "-o", "pipefail", "-c", body]
        elif lang == "python":
            assert (clone / "venv" / "bin" / "python").exists(), f"{page} line {line}: no venv yet (the README's pip block makes it)"
            argv = [str(clone / "venv" / "bin" / "python"), "-c", body]
        else:
            raise AssertionError(f"{page} line {line}: a ```c block must name its file (file=prog.c)")
        results[(page, line)] = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=900)
    return results


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A fresh clone's files, a home of its own and the environment a newcomer has."""
    venv_python = ROOT / ".venv" / "bin" / "python"
    assert venv_python.exists(), "scripts/setup makes .venv (any python3 with numpy would do)"
    tmp = tmp_path_factory.mktemp("readme")
    clone = tmp / "clone"
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, listed):
        if (ROOT / f).is_file() and not (ROOT / f).is_symlink():
            (clone / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, clone / f)
    assert not (clone / ".venv").exists()
    # cargo's output kept across sessions (incremental builds) in a directory of this checkout's target/.
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
    env["PATH"] = wrapper(tmp / "numpy-bin", venv_python) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    return tmp, clone, env


@pytest.fixture(scope="module")
def page_runs(fresh):
    """Runs every runnable block of PAGES in order; returns {(page, line): CompletedProcess}."""
    tmp, clone, env = fresh
    results = {}
    for page, path in PAGES.items():
        page_env = dict(env)
        if path == "venv":
            page_env["PATH"] = str(clone / "venv" / "bin") + os.pathsep + env["PATH"]
        results.update(run_blocks(page, clone, page_env))
    return results


@pytest.fixture(scope="module")
def torch_runs(fresh, page_runs):
    if not TORCH_PYTHON.exists():
        pytest.skip(f"{TORCH_PYTHON} is missing (scripts/setup installs PyTorch there where the registry is reachable): "
                    f"{TORCH_PAGE}'s commands need a python3 with PyTorch")
    tmp, clone, env = fresh
    torch_env = dict(env, PATH=wrapper(tmp / "torch-bin", TORCH_PYTHON) + os.pathsep + env["PATH"])
    return run_blocks(TORCH_PAGE, clone, torch_env)


def runnable(pages):
    return [b for b in ALL if b[0] in pages and b[2] in RUNNABLE and "notest" not in b[3] and "file" not in b[3]]


def check_output(body, out):
    """What each block's comments say it prints."""
    if "./a.out" in body:
        assert "10 large requests, 9 hits" in out.stdout, out.stdout
    if "np.ones(10_000_000); print(sum(" in body:
        assert out.stdout.strip() == "1000000000.0", out.stdout
    if "numpy.ones(10_000_000).sum()" in body:
        assert out.stdout.strip() == "10000000.0", out.stdout
    if "TENSORMALLOC_STATS=1" in body:
        assert "tensormalloc 0.1.0 report" in out.stderr, out.stderr
    if "epoch.py" in body:
        allocated, peak, live = map(int, out.stdout.split()[:3])
        assert allocated >= 10 * 80_000_000 and live >= 2 * 80_000_000, out.stdout
    if "plot trace.bin" in body:
        assert "wrote trace.bin.png" in out.stdout, out.stdout
    if "pool.py" in body:
        total = next(l for l in out.stdout.splitlines() if l.split()[:1] == ["total"]).split()
        # Two workers, 50 arrays each, all but the first a hit; Python's own blocks of 128 KiB and
        # more (spawning a worker imports numpy) come on top, and the parent and the resource
        # tracker make some too.
        assert int(total[1]) >= 2 and total[2] == "processes" and int(total[3]) >= 100 and int(total[4]) >= 98, out.stdout
        assert "wrote run.png" in out.stdout, out.stdout
    if "holders.py" in body and "LEAKS" in body:
        assert "libwork.so (work_begin)" in out.stderr, out.stderr
    elif "holders.py" in body:
        assert re.search(r"^libwork\.so +host +61 MiB live", out.stdout, re.M), out.stdout
    if "snap.py" in body:
        assert "snap.pickle.host.pickle" in out.stdout, out.stdout
    if "tensormalloc.loaded_by()" in body:
        assert "preload" in out.stdout and "pluggable" in out.stdout, out.stdout


@pytest.mark.parametrize("block", runnable(PAGES), ids=block_id)
def test_block_runs_as_written(page_runs, block):
    page, line, lang, opts, body = block
    out = ok(page_runs[(page, line)])
    check_output(body, out)


@pytest.mark.parametrize("block", runnable([TORCH_PAGE]), ids=block_id)
def test_pytorch_block_runs_without_a_gpu(torch_runs, block):
    page, line, lang, opts, body = block
    out = ok(torch_runs[(page, line)])
    check_output(body, out)


@pytest.mark.parametrize("block", [b for b in ALL if b[2] == "python" and "notest" in b[3]], ids=block_id)
def test_python_blocks_not_run_still_compile(block):
    compile(block[4], f"{block[0]}:{block[1]}", "exec")
