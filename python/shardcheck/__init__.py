"""shardcheck from Python: the deterministic multi-rank simulator (shardcheck.sim) and, over it,
a torch.distributed backend with a launcher (shardcheck.torch).

The compiled core (shardcheck._core) is built by the project's CMake into
<build>/python/shardcheck/; this package looks for it in SHARDCHECK_BUILD_DIR, else in the
repository's build/default."""

import os as _os

_here = _os.path.dirname(_os.path.abspath(__file__))
_build = _os.environ.get("SHARDCHECK_BUILD_DIR") or _os.path.join(
    _here, _os.pardir, _os.pardir, "build", "default"
)
_core_dir = _os.path.join(_os.path.abspath(_build), "python", "shardcheck")
if _os.path.isdir(_core_dir) and _core_dir not in __path__:
    __path__.append(_core_dir)
