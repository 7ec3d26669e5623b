"""Usage: python -m kvcompass.services.infra up|status|down [--json] [--run-dir DIR]"""

import sys

from kvcompass.services.infra.commands import main

sys.exit(main())
