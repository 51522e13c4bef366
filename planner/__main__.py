"""python -m planner: the planning CLI (planner/cli.py)."""
import sys

from planner.cli import main

sys.exit(main())
