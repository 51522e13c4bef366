"""Page entry file for st.navigation; the page itself is dashboard.views.devices.page()."""
from dashboard.views.devices import page

page()
