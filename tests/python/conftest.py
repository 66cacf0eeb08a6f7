"""pytest set-up for shardcheck's Python side: the package (python/) and the torch examples
(examples/torch/) importable; the compiled core comes from SHARDCHECK_BUILD_DIR or build/default."""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
for sub in ("python", os.path.join("examples", "torch")):
    path = os.path.join(ROOT, sub)
    if path not in sys.path:
        sys.path.insert(0, path)
