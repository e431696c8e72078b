"""Stoker's shared contracts: config, records, manifest, Kafka helpers, the embedded stack.

Nothing here imports Airflow, Spark or torch at module level, so every surface (an Airflow
deployment, a Spark cluster, a training node) can depend on this package alone.
"""

__version__ = "0.1.0"
