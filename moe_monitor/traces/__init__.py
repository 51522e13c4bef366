"""What is done with traces beyond reading and writing them (the containers are core.tracefile's): convert
other tools' files into a trace (convert.py: JSON lines, SGLang dumps, logical_count JSON), read a trace forward
in chunks (cursor.py: replay and the dashboard's trace source), and publish one into Redis as a live run
(publish.py: `moe-monitor replay`). Imports core only.
"""
