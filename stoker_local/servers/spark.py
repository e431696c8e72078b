"""A real Spark standalone cluster on 127.0.0.1: one master and N workers from pyspark's own jars
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), each a recorded
process in a session of its own, for the tests that prove the job scales out unchanged."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from stoker import paths
from stoker_local.servers import _Server, free_ports


class _SparkDaemon(_Server):
    stop_grace = 10.0

    def __init__(self, home: Path, name: str) -> None:
        super().__init__(home)
        self.name = name


class SparkStandalone:
    """``spark://127.0.0.1:<port>`` with ``workers`` workers of ``cores`` cores and ``memory`` each."""

    def __init__(self, home: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.home = Path(home)
        base = free_ports(2 + workers)
        self.port, self.ui_port = base, base + 1
        self.master = _SparkDaemon(self.home, "spark-master")
        self.workers = [_SparkDaemon(self.home, f"spark-worker-{i}") for i in range(workers)]
        self._worker_ui = [base + 2 + i for i in range(workers)]
        self.cores, self.memory = cores, memory

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        return {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(self.home / "work"),
                "SPARK_LOG_DIR": str(self.home / "logs"), "SPARK_NO_DAEMONIZE": "1"}

    def _state(self) -> dict[str, Any]:
        import json

        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
            return dict(json.load(r))

    def start(self, timeout: float = 90.0) -> SparkStandalone:
        spark_class = str(paths.venv_bin("spark-class"))
        self.master._spawn([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                            "--port", str(self.port), "--webui-port", str(self.ui_port)], self._env())
        self.master._wait(lambda: self._state().get("status") == "ALIVE", timeout)
        for w, ui in zip(self.workers, self._worker_ui, strict=True):
            w._spawn([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                      "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(ui), self.url],
                     self._env())
        alive = len(self.workers)
        self.master._wait(lambda: sum(w.get("state") == "ALIVE" for w in self._state().get("workers", []))
                          >= alive, timeout)
        return self

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        self.master.stop()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
