"""Operators of a refresh: publish (Spark), train (DeepSpeed), evaluate, review and report."""
