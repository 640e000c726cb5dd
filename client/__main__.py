"""`python -m client`: the ops command line (see client.cli)."""

from .cli import main

raise SystemExit(main())
