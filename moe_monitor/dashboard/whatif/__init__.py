"""The What-if model, pure (no Streamlit): fit and score windows (score.py), the edit session and its history,
the one undo (edits.py), traffic under a layout (traffic.py), repair within a move budget (repair.py) and keyed
caches (cache.py). The page that shows it lives in dashboard/views/whatif/."""
