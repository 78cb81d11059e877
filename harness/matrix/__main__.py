"""The command line of harness.matrix: its `main` with the arguments."""

import sys

from harness.matrix import main

sys.exit(main(sys.argv[1:]))
