"""python -m ember: the command line."""

import sys

from ember.cli import main

sys.exit(main())
