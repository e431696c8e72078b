"""The suite's helpers, shared with the benches: the 3-node cluster (``kafka_cluster``), trainers launched and
counted as the train task does (``trainer_tools``), hard faults on the Spark stage (``fault_tools``), datatrove
as the quality filters' oracle (``quality_oracle``), simulated hosts (``hosts``), small corpora
(``small_corpus``) and the gate's sabotaged nights (``sabotage``). Import them as ``tests.support.<module>``
(the suite and ``python -m bench.<name>`` both run from the checkout's root)."""
