"""python -m collectors.sglang: see collectors/sglang/cli.py."""
import sys

from .cli import main

sys.exit(main())
