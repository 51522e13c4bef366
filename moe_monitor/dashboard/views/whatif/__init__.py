"""The What-if page (page.py) and its Streamlit controls and callbacks (controls.py)."""
