"""The ``flashcore`` command from Python: the ``flashcore`` console script and ``python -m flashcore`` run the
flashcore program (bench, check, info, tune, tvla, ring; ``flashcore --help``).

In the wheel the program is ``flashcore/bin/flashcore``: a small executable linked to the package's own
``libflashcore.so`` (which holds the commands), found through its rpath. Elsewhere it is looked for as
:func:`flashcore._tune.find_cli` does: ``$FLASHCORE_CLI``, ``<repo>/build/bin/flashcore`` in a source checkout,
then a compiled ``flashcore`` on ``PATH``. The launcher replaces itself with the program (``os.execv``), so its
output, exit status and signals are the program's own.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, List, Optional, Sequence

from flashcore._tune import find_cli


def main(argv: Optional[Sequence[str]] = None, *, execv: Callable[[str, List[str]], object] = os.execv) -> int:
    """Run ``flashcore <argv>`` (default: this process's arguments). Returns 1 with a message on stderr when there is
    no program to run; otherwise does not return (``execv`` is replaceable for tests)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        program = find_cli()
    except RuntimeError as e:
        print(f"flashcore: {e}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    execv(program, [program] + args)
    return 0  # only a replaced execv returns


if __name__ == "__main__":
    sys.exit(main())
