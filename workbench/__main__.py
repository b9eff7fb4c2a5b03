"""`python -m workbench`: the same command line as `workbench`."""

import sys

from .cli import main

sys.exit(main())
