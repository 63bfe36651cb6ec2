"""``python -m bloomcrawl.ops.cli``: the ``bloomcrawl`` command."""

import sys

from bloomcrawl.ops.cli import main

sys.exit(main())
