"""One function per page; each reads the session's settings and WatchedRun and only formats what
dashboard.live.snapshot / dashboard.analytics computed."""
