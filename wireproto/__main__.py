"""``python -m wireproto``: the same as the ``wireproto`` command (see wireproto.cli)."""

import sys

from wireproto.cli import main

if __name__ == "__main__":
    sys.exit(main())
