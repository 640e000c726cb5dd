"""`python -m service.frontends --link-fd FD --index I`: one front-end process (service/frontends/frontend.py)."""

import sys

from .frontend import main

sys.exit(main())
