"""The embedded stack: what runs Stoker on one machine, apart from the contracts in :mod:`stoker`.

A Spark cluster or a GPU node deploys ``stoker`` (config, records, manifest, layout, kafka, sources)
and never imports this package. Here live the single-node Kafka broker (:mod:`.broker`), the local
Airflow stack of ``make up`` (:mod:`.services`, :mod:`.airflow_env`), the sample corpus
(:mod:`.sample`), ``stoker storage`` (:mod:`.storage`), the terminal front end (:mod:`.cli`,
:mod:`.progress`) and, in a checkout only, the test suite's S3 and HDFS servers (:mod:`.servers`).
Every process it starts is recorded with :class:`stoker.process.ProcessRecord`.
"""
