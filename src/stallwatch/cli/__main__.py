"""`python -m stallwatch.cli`: the same command line as `stallwatch`."""

import sys

from stallwatch.cli.entry import main

sys.exit(main())
