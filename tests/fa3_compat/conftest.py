"""For the CPU tests of this folder (python3 -m pytest tests/fa3_compat): the shim, the plugin and the flashcore
package of this checkout on the path. CI does not collect this folder (it runs python/tests); FA3's own tests are
run by tools/run_fa3_tests.sh, which loads fa3_plugin.py, not this file."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]

for path in (HERE, REPO_ROOT / "python"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
