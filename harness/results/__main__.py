"""The command line of harness.results: its `main` with the arguments."""

import sys

from harness.results import main

sys.exit(main(sys.argv[1:]))
