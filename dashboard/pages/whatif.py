"""Page entry file for st.navigation; the page itself is dashboard.views.whatif.page()."""
from dashboard.views import whatif

whatif.page()
