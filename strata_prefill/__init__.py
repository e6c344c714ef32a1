"""strata-prefill, one installed package: the command (this folder) and, under the same name, the
repository's rooms: `strata_prefill.contract` (contract/), `strata_prefill.formats` (formats/),
`strata_prefill.reference` (reference/), `strata_prefill.fast` (fast/), `strata_prefill.verify`
(verify/). An install maps those folders under this package (pyproject.toml's package-dir); in a
source checkout run without installing (`PYTHONPATH=.`) the checkout's root joins this package's
path so that the same names resolve to the same folders."""
from pathlib import Path as _Path

_CHECKOUT = _Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "contract" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))  # noqa: F821 - a package's own __path__
