"""Where the reader side gets records: the Source protocol (base.py) and its two implementations, a live
run in Redis (redis.py) and a recorded trace file (trace.py). Pages never know which one they read."""
