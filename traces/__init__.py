"""Columnar traces: recording, archives, replay and conversion (see README, "Traces")."""
