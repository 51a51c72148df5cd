"""scripts/plot-trace's entry, kept for `import plot_trace`: the plotting code ships in the
package as tensormalloc.plot (`tensormalloc plot TRACE`); this runs the source tree's copy."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from tensormalloc.plot import *  # noqa: E402,F401,F403 - re-exported for scripts and tests
from tensormalloc.plot import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
