"""Page entry file for st.navigation; the page itself is dashboard.views.overview.page()."""
from moe_monitor.dashboard.views.overview import page

page()
