"""``python -m torchelastic_otel.report PATH...``: the same as ``torchelastic-otel report PATH...``."""

import sys

from torchelastic_otel.report.cli import main

sys.exit(main())
