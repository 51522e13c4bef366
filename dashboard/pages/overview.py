"""Page entry file for st.navigation; the page itself is dashboard.views.overview.page()."""
from dashboard.views.overview import page

page()
