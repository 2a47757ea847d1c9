"""`python -m masa` is the `masa` command."""

import sys

from masa.cli.main import main

sys.exit(main())
