"""The Airflow side of Stoker: hooks, operators, deferrable sensors and their async triggers.

Lives in plugins/ so the triggerer imports the triggers by classpath
(``stoker_airflow.triggers.kafka.KafkaLagTrigger``): the dags folder is not on its path.
"""
