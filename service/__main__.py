"""`python -m service`: run the slotserve server."""

import sys

from .process.cli import main

sys.exit(main())
