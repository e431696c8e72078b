"""The DeepSpeed trainer fed from Kafka (Kafka token source, model recipes, checkpoints with offsets).

Not built yet: it is the next issue. The refresh DAG leaves its place between ``await_published``
and ``report`` (``train`` → ``await_consumed``), and ``stoker.kafka.compute_lag`` /
``stoker_airflow.sensors.KafkaLagSensor`` already measure a training consumer group's progress.
"""
