"""``python -m demo`` (from the checkout's root): the story of :mod:`demo.story`."""

import sys

from demo.story import main

sys.exit(main())
