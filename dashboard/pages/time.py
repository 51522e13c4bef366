"""Page entry file for st.navigation; the page itself is dashboard.views.time.page()."""
from dashboard.views.time import page

page()
