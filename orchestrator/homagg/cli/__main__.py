"""``python -m homagg.cli ...``: the same as ``homagg ...``."""

import sys

from homagg.cli import main

sys.exit(main())
