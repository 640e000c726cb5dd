"""`python -m service`: run the slotserve server."""

import sys

from .cli import main

sys.exit(main())
