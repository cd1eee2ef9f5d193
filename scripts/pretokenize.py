#!/usr/bin/env python
"""The data step: ``python scripts/pretokenize.py --config_path X [...]`` is ``python -m levanter_mars.main.pretokenize``
(see it for the options and exit codes)."""

import sys

from levanter_mars.main.pretokenize import cli

if __name__ == "__main__":
    sys.exit(cli())
