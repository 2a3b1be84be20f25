"""``python -m notifyq_bench`` runs the benchmark."""

import sys

from notifyq_bench import main

sys.exit(main(sys.argv[1:]))
