"""Page entry file for st.navigation; the page itself is dashboard.views.whatif.page.page()."""
from moe_monitor.dashboard.views.whatif.page import page

page()
