"""`python -m service`: run the slotserve server; `python -m service check PATH`: check a repository first."""

import sys

if sys.argv[1:2] == ["check"]:
    from .check import main as check_main

    sys.exit(check_main(sys.argv[2:]))

from .cli import main

sys.exit(main())
