"""``python -m dayzero``: the same as the ``dayzero`` command."""

import sys

from dayzero.cli.app import main

sys.exit(main())
