"""Old name of the planning CLI, kept for one release: `python -m dashboard.plan` runs `python -m planner`
and says so on stderr."""
import sys

from moe_monitor.planner.cli import main

if __name__ == "__main__":
    print("note: `python -m dashboard.plan` is now `python -m planner` (same flags)", file=sys.stderr)
    sys.exit(main())
