"""Loki's benchmarks: ``python -m bench [--quick] [--only NAME]`` (``make bench``,
``make bench-quick``). See ``bench/README.md`` for the contract each ``*_bench.py`` follows.

``LOKI_BENCH_EXTRA`` (directories separated by ``os.pathsep``) adds directories whose
``*_bench.py`` modules are discovered and run as part of this package (the harness's own
tests use it for deliberately broken benches).
"""

import os as _os

__path__ += [d for d in _os.environ.get("LOKI_BENCH_EXTRA", "").split(_os.pathsep) if d]
