"""`python3 -m strata_prefill ...` runs the `strata-prefill` command."""
import sys

from strata_prefill.cli import main

sys.exit(main())
