"""`python -m infra.pricing refresh [...]`: the price table's refresh (infra/pricing/refresh.py)."""

import sys

from infra.pricing.refresh import main

sys.exit(main(sys.argv[1:]))
