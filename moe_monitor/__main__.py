"""python -m moe_monitor: the `moe-monitor` command."""
import sys

from moe_monitor.cli import main

sys.exit(main())
