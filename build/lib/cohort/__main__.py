"""`python -m cohort ...` is the `cohort` command (for a venv whose scripts are not on PATH)."""

import sys

from cohort.cli import main

sys.exit(main())
