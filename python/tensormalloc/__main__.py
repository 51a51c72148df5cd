"""The `tensormalloc` command: the pip package's console script, `python -m tensormalloc`, and,
through scripts/tensormalloc (the launcher scripts/install puts in PREFIX/bin), the same program
with the same subcommands:

    tensormalloc [run] COMMAND [ARGS...]    COMMAND with the library preloaded (exec: its exit status)
    tensormalloc report STATS.json...       a run's processes side by side
    tensormalloc plot TRACE...              draw traces
    tensormalloc --path | --version | --help

`--help` lists every setting from _settings.py, which src/config/options.rs's table writes (a test
checks). The launcher never loads the library into itself: it would read the settings and start
a trace meant for COMMAND."""
import errno
import os
import shutil
import signal
import sys
import textwrap

from . import __version__, library_path
from ._settings import GROUPS, LEGEND, SETTINGS

_COMMANDS = (("[run] COMMAND [ARGS...]", "run COMMAND with libtensormalloc.so preloaded (its exit status)"),
             ("report STATS.json...", "a run's processes side by side, and their total (--json)"),
             ("plot TRACE [OUT.png]", "draw a trace: memory over time, request sizes (needs matplotlib)"),
             ("plot TRACE... -o OUT.png", "several processes' traces: one lane each, one time axis"),
             ("--path", "print the path of the libtensormalloc.so it preloads"),
             ("--version", "print the version"),
             ("--help", "this, with every setting and its default"),
             ("-- COMMAND [ARGS...]", 'run a COMMAND named like one of these ("plot")'))
USAGE = "\n".join(f"{'usage:' if i == 0 else '':6} tensormalloc {cmd:<24} {what}" for i, (cmd, what) in enumerate(_COMMANDS))

HELP_TAIL = """
what it did, at exit:
  TENSORMALLOC_STATS=1 tensormalloc python3 train.py       a report on stderr (json:PATH: as JSON)
  TENSORMALLOC_LEAKS=1 tensormalloc python3 train.py       large blocks still live, and who asked for them
a trace of every large allocation and free, then its plot:
  TENSORMALLOC_TRACE=trace.bin tensormalloc python3 train.py
  tensormalloc plot trace.bin                              (writes trace.bin.png)
in Python: tensormalloc.stats(), tensormalloc.scope(NAME), tensormalloc.holders();
  tensormalloc.numpy.enable() without the preload; tensormalloc.torch.enable() for PyTorch
the same list, with links: docs/configuration.md (in the source tree, and PREFIX/share/doc/tensormalloc
  after scripts/install)"""


def help_text(width=100):
    lines = [USAGE, HELP_TAIL, "", "settings:"]
    for line in LEGEND:
        lines += textwrap.wrap(line, width, initial_indent="  - ", subsequent_indent="    ")
    for group in GROUPS:
        lines += ["", f"{group}:"]
        for name, default, in_group, doc, also in SETTINGS:
            if in_group != group:
                continue
            lines.append(f"  {name}={default}")
            text = f"{doc} ({also})" if also else doc
            lines.extend(textwrap.wrap(text, width, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def without_our_copies(preload):
    """LD_PRELOAD's entries but any copy of the library already there (one copy per process:
    a second behind the first handed libc's own definitions past both, for calls through
    libc's handle)."""
    entries = preload.replace(":", " ").split()
    return [e for e in entries if not os.path.basename(e).startswith("libtensormalloc")]


def unpreloadable(lib):
    """Why ld.so could not preload `lib`, or None. It splits LD_PRELOAD at spaces and colons
    (a venv under "My Projects" preloaded "/…/My" and ran the program without us, with an
    ld.so error line in every child), and names a file that is no shared library only in such a
    line (the package hunter)."""
    if any(c.isspace() or c == ":" for c in lib):
        return (f"the library's path has a space or a colon, which LD_PRELOAD cannot carry: {lib} "
                "(set TENSORMALLOC_LIB to a copy at a path without them)")
    try:
        with open(lib, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return f"{lib} is not a shared library"
    except OSError as e:
        return f"{lib}: {e.strerror}"
    return None


def in_path_as_file(name, path):
    """Whether PATH holds a file (not a directory) of this name: a shell says "Permission denied"
    for one it cannot run, "command not found" when there is only a directory."""
    return any(os.path.isfile(os.path.join(d or ".", name)) for d in (path or os.defpath).split(os.pathsep))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv in (["run"], ["--"]):
        print(USAGE + "\n(tensormalloc --help: every setting, the report and the trace)", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(help_text())
        return 0
    if argv[0] == "--version":
        print(f"tensormalloc {__version__}")
        return 0
    if argv[0] == "plot":
        try:
            from .plot import main as plot
        except ImportError as e:  # numpy, which the trace's reader needs; matplotlib is asked for later
            print(f"tensormalloc plot: needs numpy and matplotlib ({e}): {sys.executable} -m pip install numpy matplotlib"
                  " (where that is the system's Python and pip refuses: apt install python3-numpy python3-matplotlib)",
                  file=sys.stderr)
            return 1
        return plot(argv[1:])
    if argv[0] == "report":
        from .report import main as report
        return report(argv[1:])
    path_only = argv[0] == "--path"
    if argv[0].startswith("-") and argv[0] not in ("--", "--path"):
        print(f"tensormalloc: unknown option {argv[0]} (tensormalloc --help lists them; "
              f"tensormalloc -- {argv[0]} runs a program of that name)", file=sys.stderr)
        return 2
    if argv[0] in ("--", "run"):
        argv = argv[1:]
    try:
        lib = library_path()
    except FileNotFoundError as e:
        print(f"tensormalloc: {e}", file=sys.stderr)
        return 1
    if path_only:
        print(lib)
        return 0
    why = unpreloadable(lib)
    if why:
        print(f"tensormalloc: {why}", file=sys.stderr)
        return 1
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join([lib] + without_our_copies(env.get("LD_PRELOAD", "")))
    sys.stdout.flush()
    sys.stderr.flush()
    # Python starts with SIGPIPE and SIGXFSZ ignored, and an ignored signal stays ignored across
    # exec: the program would write on into a closed pipe (`tensormalloc prog | head` never
    # ended) or past its file size limit. A shell gives it the defaults, as subprocess does.
    for name in ("SIGPIPE", "SIGXFSZ"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    # What a shell says and returns: a name looked up in PATH is "not found"; a path names its
    # reason, and a directory is no program.
    if not argv[0]:
        print("tensormalloc: : command not found", file=sys.stderr)
        return 127
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        why = os.strerror(errno.ENOENT) if "/" in argv[0] else "command not found"
        print(f"tensormalloc: {argv[0]}: {why}", file=sys.stderr)
        return 127
    except PermissionError:
        if "/" not in argv[0] and not in_path_as_file(argv[0], env.get("PATH")):
            print(f"tensormalloc: {argv[0]}: command not found", file=sys.stderr)
            return 127
        why = os.strerror(errno.EISDIR) if os.path.isdir(argv[0]) else os.strerror(errno.EACCES)
        print(f"tensormalloc: {argv[0]}: {why}", file=sys.stderr)
        return 126
    except OSError as e:
        if e.errno == errno.ENOEXEC:
            # An executable file with no #! line: a shell script, run as execvp and shells run it.
            program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
            if program:
                try:
                    os.execve("/bin/sh", ["/bin/sh", program] + argv[1:], env)
                except OSError:
                    pass  # no /bin/sh (a distroless image): the first error is the one to name
        print(f"tensormalloc: {argv[0]}: {os.strerror(e.errno or errno.EIO)}", file=sys.stderr)
        return 126


def entry(argv=None):
    """The command's entry point: a reader that stops early (`tensormalloc report F | head`)
    ends it quietly, as it ends cat, with no traceback."""
    try:
        code = main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would try the flush again at exit and print the error: point stdout elsewhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(entry())
