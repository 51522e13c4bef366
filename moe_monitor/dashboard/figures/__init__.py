"""Vega-Lite figure builders, one module per page family (load pages, experts, GPU panel, time, What-if);
common.py holds the house conventions and payload rules. Pure: arrays in, a Chart (spec and datasets) out."""
