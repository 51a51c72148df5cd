"""`tensormalloc CMD ARGS...` (and `python -m tensormalloc CMD ARGS...`): runs CMD with the
library preloaded, as jemalloc.sh does. The process is replaced (exec), so CMD's exit status is
the command's. `plot TRACE` draws a trace, `--path` prints the library's path, `--version` the
package's version, `--help` all that and every setting with its default (_settings.py: the
library's own options table, checked against src/config.rs by a test). The launcher never loads
the library into itself: it would read the settings and start a trace meant for COMMAND."""
import os
import sys
import textwrap

from . import library_path
from ._settings import SETTINGS

_COMMANDS = (("COMMAND [ARGS...]", "run COMMAND with libtensormalloc.so preloaded"),
             ("plot TRACE [OUT.png]", "draw a trace: memory over time, request sizes (needs matplotlib)"),
             ("plot TRACE... -o OUT.png", "several processes' traces: one lane each, one time axis"),
             ("report STATS.json...", "a run's processes side by side, and their total (--json)"),
             ("--path", "print the path of libtensormalloc.so"),
             ("--version", "print the package's version"),
             ("--help", "this, with every setting and its default"),
             ("-- COMMAND [ARGS...]", 'run a COMMAND named like one of these ("plot")'))
USAGE = "\n".join(f"{'usage:' if i == 0 else '':6} tensormalloc {cmd:<21} {what}" for i, (cmd, what) in enumerate(_COMMANDS))

HELP_TAIL = """
what it did, printed at exit (a report on stderr):
  TENSORMALLOC_STATS=1 tensormalloc python train.py        (json:PATH writes it as JSON)
  TENSORMALLOC_LEAKS=1 tensormalloc python train.py        (large blocks still live at exit)
a trace of every large allocation and free, then its plot:
  TENSORMALLOC_TRACE=trace.bin tensormalloc python train.py
  tensormalloc plot trace.bin                              (writes trace.bin.png)
in Python: tensormalloc.stats(), tensormalloc.scope(NAME); tensormalloc.numpy.enable() without the preload

settings (environment variables, read once when the library loads; sizes take K/M/G/T):"""


def help_text(width=100):
    lines = [USAGE, HELP_TAIL]
    for name, default, doc in SETTINGS:
        lines.append(f"  {name}={default}")
        lines.extend(textwrap.wrap(doc, width, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print(USAGE + "\n(tensormalloc --help: every setting, the report and the trace)", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(help_text())
        return 0
    if argv[0] == "plot":
        from .plot import main as plot
        return plot(argv[1:])
    if argv[0] == "report":
        from .report import main as report
        return report(argv[1:])
    if argv[0] == "--":
        argv = argv[1:]
        if not argv:
            print(USAGE, file=sys.stderr)
            return 2
    try:
        lib = library_path()
    except FileNotFoundError as e:
        print(f"tensormalloc: {e}", file=sys.stderr)
        return 1
    if argv[0] == "--path":
        print(lib)
        return 0
    if argv[0] == "--version":
        from importlib.metadata import PackageNotFoundError, version
        try:
            print(f"tensormalloc {version('tensormalloc')}")
        except PackageNotFoundError:
            print("tensormalloc (source tree)")
        return 0
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib + (" " + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        print(f"tensormalloc: {argv[0]}: command not found", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"tensormalloc: {argv[0]}: permission denied", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main())
