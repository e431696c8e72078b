"""Sensors of a refresh. The Kafka ones defer to async triggers, so a long wait holds no worker slot."""
