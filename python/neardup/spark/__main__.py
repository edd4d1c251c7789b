"""``python -m neardup.spark dedup ...``: the command line (:func:`neardup.spark.main`).

``spark-submit`` runs this file by its path as well
(``spark-submit ... neardup/spark/__main__.py dedup ...``)."""

import os
import sys

if not __package__:
    # Run by its path: Python put this folder first on sys.path, where the
    # job's modules would shadow top-level ones of the same names.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from neardup.spark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
