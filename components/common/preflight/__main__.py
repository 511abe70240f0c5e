"""`python -m components.common.preflight` (and `torchrun ... -m components.common.preflight`): see the package."""

import sys

from components.common.preflight.cli import main

sys.exit(main())
