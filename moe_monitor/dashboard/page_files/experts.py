"""Page entry file for st.navigation; the page itself is dashboard.views.experts.page()."""
from moe_monitor.dashboard.views.experts import page

page()
