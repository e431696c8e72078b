"""Async triggers for the triggerer: Kafka's blocking admin calls run in a thread, never on the loop."""
