"""`python -m bench.soak`: the soak, as `python -m bench run soak` runs it."""

import sys

from .cli import main

sys.exit(main())
