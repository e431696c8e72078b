"""Kafka as Stoker uses it: clients by role, their settings, topics, offsets and lag."""
