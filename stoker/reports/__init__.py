"""What people read: run summaries, the catalog, ``stoker check``, ``stoker gc``, the run page's charts."""
