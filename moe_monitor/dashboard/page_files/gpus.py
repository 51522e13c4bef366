"""Page entry file for st.navigation; the page itself is dashboard.views.gpus.page()."""
from moe_monitor.dashboard.views.gpus import page

page()
