"""PySpark applications: pure DataFrame→DataFrame transforms plus thin ``main()`` entry points.

Nothing here imports Airflow; a Spark cluster needs only ``stoker`` and ``spark_jobs``.
"""
