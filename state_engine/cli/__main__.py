"""``python -m state_engine.cli ...``: statectl without its console script."""

import sys

from state_engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
