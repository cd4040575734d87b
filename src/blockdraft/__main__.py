"""`python -m blockdraft` (the form torchrun launches) is the same as the `blockdraft` command."""

import sys

from blockdraft.cli import main

sys.exit(main())
