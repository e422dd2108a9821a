"""``python -m embgeom``: the same as the ``embgeom`` command (:func:`embgeom.cli.main`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
