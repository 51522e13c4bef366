"""Shared test kits: tiny transformers models, Redis fillers (real collector and wire-level), the browser
kit and the AppTest runner."""
