"""Prometheus exporter: the dashboard's numbers for a Prometheus server to scrape (no browser needed).

metrics.py turns a watched run's snapshot into metric families (pure: the same analytics the pages use);
server.py polls the runs on a timer and serves the last families to every scrape; `python -m
the exporter` runs it (loopback by default).
"""
