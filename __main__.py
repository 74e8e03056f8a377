"""`python -m mqstore`: the same as the `mqstore` command."""

import sys

from mqstore.cli import main

sys.exit(main())
