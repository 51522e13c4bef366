"""Plotly figure builders, one module per page family (load pages, experts, GPU panel, What-if); common.py
holds the house layout and payload rules. Pure: arrays in, go.Figure out, no Streamlit."""
