"""``python -m notifyq.bench`` runs the benchmark."""

import sys

from notifyq.bench import main

sys.exit(main(sys.argv[1:]))
