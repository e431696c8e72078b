"""The model lines' Airflow pools: one slot per line (``stoker_line_<line>``), counting deferred tasks.

A line's train task waits deferred for hours and must hold its line's slot meanwhile; without its
pool the scheduler never runs the task. Every deployment makes them once its metadata database is
migrated, and again when a corpus names a new line:

    python -m stoker_airflow.pools          # the local stack, docker-compose's airflow-init, a Helm job

It reads the corpus configs (``STOKER_CORPORA``, default the project's ``corpora/``) and needs only
the Airflow package and the contracts (``stoker``), not the local stack.
"""

from __future__ import annotations

import sys


def sync_line_pools() -> list[str]:
    """Create or update the pool of every model line of the corpora; their names."""
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    from stoker import paths
    from stoker.config.corpus import load_each
    from stoker.layout import line_pool

    configs, _ = load_each(paths.corpora_dir())
    lines = sorted({c.train.line for c in configs})
    with create_session() as s:
        for line in lines:
            Pool.create_or_update_pool(line_pool(line), 1, f"model line {line}: one night trains at a time", True,
                                       session=s)
    return [line_pool(line) for line in lines]


if __name__ == "__main__" and sys.argv[1:] in ([], ["sync"]):
    print("pools: " + ", ".join(sync_line_pools()))
