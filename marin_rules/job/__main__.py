"""`python -m marin_rules.job ...`: build one artifact (see marin_rules.job.main)."""

import sys

from marin_rules.job.main import main

sys.exit(main())
