"""`tensormalloc CMD ARGS...` (and `python -m tensormalloc CMD ARGS...`): runs CMD with the
library preloaded, as jemalloc.sh does. The process is replaced (exec), so CMD's exit status is
the command's. `--path` prints the library's path, `--version` the package's version."""
import os
import sys

from . import library_path

USAGE = """usage: tensormalloc COMMAND [ARGS...]   run COMMAND with libtensormalloc.so preloaded
       tensormalloc --path                print the path of libtensormalloc.so
       tensormalloc --version"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
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
