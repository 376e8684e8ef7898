"""``python -m flashcore <command> [options]``: the flashcore program (flashcore._cli), e.g. ``python -m flashcore info``."""

import sys

from flashcore._cli import main

sys.exit(main())
