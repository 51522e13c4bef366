"""Page entry file for st.navigation; the page itself is dashboard.views.time.page()."""
from moe_monitor.dashboard.views.time import page

page()
