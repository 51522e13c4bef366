"""Helper scripts run from the repo root with python -m scripts.<name>."""
