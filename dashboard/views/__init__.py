"""One function per page; each reads the session's settings and Monitor and only formats what
dashboard.snapshot / dashboard.analytics computed."""
