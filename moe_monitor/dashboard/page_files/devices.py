"""Page entry file for st.navigation; the page itself is dashboard.views.devices.page()."""
from moe_monitor.dashboard.views.devices import page

page()
