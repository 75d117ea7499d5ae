"""``python -m flywheel``: the same as the ``flywheel`` command."""

import sys

from flywheel.cli import main

sys.exit(main())
