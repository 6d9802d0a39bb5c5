"""``python -m simdist``: the same command line as the ``simdist`` console script."""

import sys

from .cli import main

sys.exit(main())
