"""Where the project keeps what it computes once (compiled kernels, reference results, the default
pack, the gate's test packs): $XDG_CACHE_HOME/strata-prefill, or ~/.cache/strata-prefill where
XDG_CACHE_HOME is unset or not absolute (the XDG rule: a relative value is ignored). One home, so
the kernel cache, the reference cache and the packs cannot drift apart."""
from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "strata-prefill"
