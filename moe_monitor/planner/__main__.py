"""python -m planner: the planning CLI (planner/cli.py)."""
import sys

from moe_monitor.planner.cli import main

sys.exit(main())
