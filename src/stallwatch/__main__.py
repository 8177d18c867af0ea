"""`python -m stallwatch`: the same command line as `stallwatch`."""

import sys

from stallwatch.cli import main

sys.exit(main())
