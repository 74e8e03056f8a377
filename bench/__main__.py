"""`python -m mqstore.bench [--quick] [--out DIR]`."""

import sys

from mqstore.bench.cli import main

sys.exit(main())
