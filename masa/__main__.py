"""`python -m masa` is the `masa` command."""

import sys

from masa.cli import main

sys.exit(main())
