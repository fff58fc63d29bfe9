"""`python -m swiftlm ...`: the same as the `swiftlm` command."""

import sys

from swiftlm.cli import main

sys.exit(main())
