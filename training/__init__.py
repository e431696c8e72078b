"""The DeepSpeed trainer fed from Kafka.

* :mod:`training.trainer`: the :class:`~training.trainer.Trainer` (model, engine, Kafka token
  source, metrics, checkpoints; ``train_step``/``checkpoint``/``finish``), and ``train.py`` its
  command line, launched by the refresh DAG's ``train`` task (``DeepSpeedTrainOperator``);
* :mod:`training.data`: the stateful Kafka token source whose offsets live in the checkpoint;
* :mod:`training.model`: the DeepSeek-V3 model (its run shapes, the recipes, are :mod:`stoker.config.recipes`);
* :mod:`training.checkpoint`, :mod:`training.metrics`: checkpoints with offsets, metrics and the loss curve.
"""
