"""Every name and path of a run, in one place. Each surface asks this module; none spells another's.

A run is one refresh of one corpus for one date::

    <runs>/<corpus>/<ds>/                 RunLayout.run_dir
      manifest.json                       .manifest        written last by the Spark job: the commit point
      quarantine/                         .quarantine      rejected records with their raw bytes
      quarantine_samples.json             .quarantine_samples  the first few of each reason, for people
      timings.json                        .timings         each stage's first start and last end
      summary.json                        .summary         the report task's run summary
      train/<topic>/                      .trainer(topic)  one trainer per published topic (TrainerFiles)

Kafka names: the run's topic is ``stoker.<corpus>.<ds_nodash>.a<attempt>`` (one per publish
attempt, so a retry never mixes with what an earlier attempt left), its task log
``<topic>.tasks``, and the training consumer group ``stoker-train.<topic>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stoker import paths
from stoker.process import ProcessRecord

MANIFEST_NAME = "manifest.json"
TOPIC_PREFIX = "stoker"
_ATTEMPT = re.compile(r"(?P<run>.+)\.a(?P<attempt>\d+)")


CHECKPOINT_TAG = re.compile(r"step\d{8}")
FORK_FILE = "fork.json"
"""``wsd``: in a trainer's checkpoint folder, the tag of the state before the night's cooldown."""
CHECKPOINT_COMPLETE = "stoker_complete.json"
"""Written into a checkpoint tag's folder after every rank saved its part (a barrier): only such a tag
is ever resumed, promoted or kept by pruning. DeepSpeed's own ``latest`` is written before the other
ranks' shards may be complete."""


def checkpoint_tag(step: int) -> str:
    return f"step{step:08d}"


def complete_checkpoints(ckpt_dir: Path) -> list[str]:
    """The tags in ``ckpt_dir`` that every rank finished saving, oldest first."""
    try:
        tags = [d.name for d in ckpt_dir.iterdir() if CHECKPOINT_TAG.fullmatch(d.name)]
    except OSError:
        return []
    return sorted(t for t in tags if (ckpt_dir / t / CHECKPOINT_COMPLETE).is_file())


@dataclass(frozen=True, slots=True)
class TrainerFiles:
    """The folder of one trainer (one per run topic) and what lives in it."""

    folder: Path

    @property
    def process(self) -> ProcessRecord:
        """The launcher's process record (pid + start time); see :mod:`stoker.process`."""
        return ProcessRecord(self.folder / "trainer.pid")

    @property
    def log(self) -> Path:
        return self.folder / "trainer.log"

    @property
    def rc(self) -> Path:
        """The launcher's exit code, written by the shell that wraps it."""
        return self.folder / "trainer.rc"

    @property
    def publication(self) -> Path:
        """Which publication of the topic this trainer's state belongs to (``Manifest.publication``)."""
        return self.folder / "publication"

    @property
    def summary(self) -> Path:
        return self.folder / "train_summary.json"

    @property
    def checkpoints(self) -> Path:
        return self.folder / "checkpoints"

    @property
    def export(self) -> Path:
        return self.folder / "hf"

    @property
    def trunk(self) -> Path:
        """``wsd``: the weights before the night's cooldown (an HF folder), which the next night continues."""
        return self.folder / "trunk"

    @property
    def fork(self) -> Path:
        """``wsd``: which checkpoint tag holds the state before the cooldown (kept by pruning, joined to the line)."""
        return self.checkpoints / FORK_FILE

    @property
    def metrics(self) -> Path:
        return self.folder / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.folder / "tensorboard"

    @property
    def loss_curve(self) -> Path:
        return self.folder / "loss.png"

    @property
    def keys_log(self) -> Path:
        """The audit log of trained keys (``train.log_keys``): a line per step, one file per rank
        (``{rank}`` is the rank)."""
        return self.folder / "keys.{rank}.jsonl"

    @property
    def replay(self) -> Path:
        """``train.replay``: the rows drawn from the line's earlier nights (stoker/lines/replay.py); the trainer mixes
        them in when the folder is there (:mod:`stoker.lines.replay_rows`)."""
        return self.folder / "replay"

    @property
    def replay_store(self) -> Path:
        """The night's own rows it leaves to its line's replay store (stoker/lines/replay.py ``keep_store``)."""
        return self.folder / "replay_store"

    @property
    def replay_draw(self) -> Path:
        """What the replay rows are: the parent, the share, per topic drawn, read and missing."""
        return self.folder / "replay.json"

    @property
    def secrets(self) -> Path:
        """The Kafka client config for launchers on other nodes (0600; removed when the task ends)."""
        return self.folder / "secrets.json"

    @property
    def heartbeat(self) -> Path:
        """Rewritten every few seconds by the launcher's supervising shell (``stoker.process.Heartbeat``):
        a triggerer on another host tells from it whether the trainer still runs."""
        return self.folder / "heartbeat.json"

    @property
    def stop_request(self) -> Path:
        """Written by a host that must stop this trainer where it runs elsewhere: the supervising shell on the
        trainer's host obeys it at its next beat (``stoker_airflow.launcher.supervise``)."""
        return self.folder / "stop.request"

    @property
    def stop_confirmed(self) -> Path:
        """Written on the trainer's host once every process of it there is stopped (``stoker.process``'s
        ``stop-tagged --confirm``): the host and the pids."""
        return self.folder / "stop.confirmed"

    @property
    def parent(self) -> Path:
        """The model this trainer's night continues (``stoker.lines.nights.Parent``), fixed at its first launch
        so that every retry of the night starts from the same model."""
        return self.folder / "parent.json"

    @property
    def phase(self) -> Path:
        """What rank 0 is doing before its first step (``{"phase", "at"}``): importing, joining the other
        ranks, building the model, loading a checkpoint; ``stoker refresh`` shows it while it waits."""
        return self.folder / "trainer_phase.json"

    @property
    def evaluation(self) -> Path:
        """Rank 0's scores of the exported model (and the one it continued) on the night's held-out sets, right
        after the export, in the trainer's process (training/evaluate.py); the evaluate task takes them."""
        return self.folder / "eval.json"

    @property
    def failure(self) -> Path:
        """Written by a rank that failed in a way no relaunch can fix (``{"reason", "message"}``: data
        that retention deleted before it was read, say); the train task then fails for good."""
        return self.folder / "trainer_failure.json"

    def exit_code(self) -> int | None:
        try:
            return int(self.rc.read_text().strip())
        except (OSError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class RunLayout:
    """The folder of one run and everything in it."""

    run_dir: Path

    @classmethod
    def of(cls, corpus: str, ds: str, root: Path | str | None = None) -> RunLayout:
        """The run of ``corpus`` on ``ds`` under ``root`` (default: the state folder's runs/).
        ``ds`` may be a Jinja template: the paths are then templates too."""
        return cls(Path(root if root is not None else paths.runs_dir()) / corpus / ds)

    @classmethod
    def of_manifest(cls, manifest_path: Path | str) -> RunLayout:
        return cls(Path(manifest_path).parent)

    @property
    def manifest(self) -> Path:
        return self.run_dir / MANIFEST_NAME

    @property
    def plan(self) -> Path:
        """The run plan (``stoker.run.plan.RunPlan``): the corpus config with the run's params, written before Spark."""
        return self.run_dir / "plan.json"

    @property
    def quarantine(self) -> Path:
        return self.run_dir / "quarantine"

    @property
    def quarantine_samples(self) -> Path:
        """The first few quarantined records of each reason, by place (spark_jobs/quarantine.py): the run's page."""
        return self.run_dir / "quarantine_samples.json"

    @property
    def holdout(self) -> Path:
        """The night's held-out documents, packed (stoker.run.holdout): one file per pack task."""
        return self.run_dir / "holdout"

    @property
    def evaluation(self) -> Path:
        """The night's figures on held-out data (training/evaluate.py), written by the evaluate task."""
        return self.run_dir / "eval.json"

    @property
    def lm_eval(self) -> Path:
        """The night's lm-evaluation-harness figures (``eval.lm_eval_tasks``; training/lm_eval_tasks.py), which
        the evaluate task also puts into ``eval.json`` as ``lm_eval``."""
        return self.run_dir / "lm_eval.json"

    @property
    def timings(self) -> Path:
        return self.run_dir / "timings.json"

    @property
    def spark_progress(self) -> Path:
        """The Spark job's latest progress line (``{"line", "at"}``), for ``stoker refresh``'s live line."""
        return self.run_dir / "spark_progress.json"

    @property
    def summary(self) -> Path:
        return self.run_dir / "summary.json"

    @property
    def train_dir(self) -> Path:
        return self.run_dir / "train"

    @property
    def logs(self) -> Path:
        """Terminal-side logs of a run started from the CLI (Airflow's, Spark's, the trainer's)."""
        return self.run_dir / "logs"

    def trainer(self, topic: str) -> TrainerFiles:
        return TrainerFiles(self.train_dir / topic)


@dataclass(frozen=True, slots=True)
class NightFiles:
    """One trained night of a model line: its record, its final checkpoint (model and optimizer, for
    the next night) and its Hugging Face export with the model card."""

    folder: Path

    @property
    def record(self) -> Path:
        return self.folder / "night.json"

    @property
    def checkpoint(self) -> Path:
        """A DeepSpeed checkpoint folder (``latest`` + one tag)."""
        return self.folder / "checkpoint"

    @property
    def model(self) -> Path:
        return self.folder / "hf"

    @property
    def trunk(self) -> Path:
        """``wsd``: the weights before the night's cooldown; the next night starts from them, not from ``model``."""
        return self.folder / "trunk"

    @property
    def card(self) -> Path:
        return self.model / "README.md"

    @property
    def holdout(self) -> Path:
        """The night's held-out documents (stoker.run.holdout), kept with it: later nights measure on them what
        they cost the earlier data."""
        return self.folder / "holdout"

    @property
    def replay_store(self) -> Path:
        """Some of the night's own sequences, for later nights to replay once its topic is gone (``train.replay``):
        a folder of :mod:`stoker.lines.replay_rows`; a night of an earlier Stoker left ``replay_store.npz``
        (:attr:`replay_store_legacy`)."""
        return self.folder / "replay_store"

    @property
    def replay_store_legacy(self) -> Path:
        return self.folder / "replay_store.npz"


@dataclass(frozen=True, slots=True)
class LineLayout:
    """A model line: the nights it trained, one per date and corpus (several corpora may feed a line)::

        <state>/lines/<line>/nights/<ds>.<corpus>   a link to the night's folder in .store (NightFiles)
        <state>/lines/<line>/nights/.store/         night folders; a promotion swaps the link atomically
        <state>/lines/<line>/mixes/<ds>.json        a mixture night's plan (stoker.lines.mix_plan), written once
        <state>/lines/<line>/mixes/<ds>.claim.json  the Airflow run that trains that night (stoker.lines.mix_plan)
    """

    folder: Path

    @classmethod
    def of(cls, line: str, root: Path | str | None = None) -> LineLayout:
        return cls(Path(root if root is not None else paths.state_dir() / "lines") / line)

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def nights_dir(self) -> Path:
        return self.folder / "nights"

    @property
    def store(self) -> Path:
        """Where night folders live; ``nights/<ds>.<corpus>`` links to the current one of each night."""
        return self.nights_dir / ".store"

    def night(self, ds: str, corpus: str) -> NightFiles:
        return NightFiles(self.nights_dir / f"{ds}.{corpus}")

    def mix_plan(self, ds: str) -> Path:
        """Night ``ds``'s plan when the line trains a mixture (``corpora/lines/<line>.yaml``)."""
        return self.folder / "mixes" / f"{ds}.json"

    def mix_claim(self, ds: str) -> Path:
        """Which run of the line's DAG trains night ``ds`` (several corpora's publications start runs for it)."""
        return self.folder / "mixes" / f"{ds}.claim.json"

    def nights(self) -> list[NightFiles]:
        """Every night with a record, by name (date, then corpus)."""
        found = [NightFiles(p.parent) for p in self.nights_dir.glob("*/night.json")
                 if not p.parent.name.startswith(".")]  # the store, a promotion's temporary link
        return sorted(found, key=lambda n: n.folder.name)


def line_pool(line: str) -> str:
    """The Airflow pool (one slot) that lets one night of a line train at a time."""
    return f"stoker_line_{line}"


def all_runs(root: Path | str | None = None) -> Iterator[RunLayout]:
    """Every run folder with a manifest under ``root``."""
    base = Path(root if root is not None else paths.runs_dir())
    for m in base.glob(f"*/*/{MANIFEST_NAME}"):
        yield RunLayout(m.parent)


def all_trainers(root: Path | str | None = None) -> Iterator[TrainerFiles]:
    """Every trainer folder under ``root`` (running or not)."""
    base = Path(root if root is not None else paths.runs_dir())
    for run in base.glob("*/*"):
        for folder in RunLayout(run).train_dir.glob("*"):
            if folder.is_dir():
                yield TrainerFiles(folder)


# -- Kafka names ----------------------------------------------------------------------------------
def run_topic(corpus: str, ds: str, attempt: int | str) -> str:
    """The topic of one publish attempt of a run (``ds`` as YYYY-MM-DD)."""
    return f"{TOPIC_PREFIX}.{corpus}.{ds.replace('-', '')}.a{attempt}"


def topic_prefix(corpus: str) -> str:
    """Every topic of a corpus starts with this (an Asset URI, a listing)."""
    return f"{TOPIC_PREFIX}.{corpus}"


def tasks_topic(topic: str) -> str:
    """The Spark tasks' done records of a publish (spark_jobs/publish.py)."""
    return f"{topic}.tasks"


def consumer_group(topic: str) -> str:
    """The training consumer group of a run topic: its lag is the run's training progress."""
    return f"stoker-train.{topic}"


def earlier_attempts(topic: str, existing: Iterable[str]) -> list[str]:
    """Of ``existing`` topics, those left by other attempts of ``topic``'s run (and their task logs),
    plus ``topic``'s own task log: garbage once ``topic``'s manifest is written."""
    stale = {tasks_topic(topic)}
    match = _ATTEMPT.fullmatch(topic)
    if match:
        other = re.compile(re.escape(match.group("run")) + r"\.a\d+(\.tasks)?")
        stale |= {t for t in existing if other.fullmatch(t) and t != topic}
    return sorted(stale)


def run_of_topic(topic: str) -> str:
    """The topic name without its attempt suffix (what every attempt of a run shares)."""
    match = _ATTEMPT.fullmatch(topic)
    return match.group("run") if match else topic
