"""Page entry file for st.navigation; the page itself is dashboard.views.experts.page()."""
from dashboard.views.experts import page

page()
