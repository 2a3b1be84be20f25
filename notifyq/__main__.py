"""``python -m notifyq`` runs the CLI."""

import sys

from notifyq.cli import main

sys.exit(main())
