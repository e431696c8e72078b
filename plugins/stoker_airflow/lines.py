"""The model line around a refresh's tasks (:mod:`stoker.lines`): before Spark runs, the night's parent
is chosen and the corpus tokenizer checked against it; at every launch of the trainer the parent and
the role are chosen again and the tokenizer checked again and recorded in the trainer's folder (another night may
have joined the line between a failed try and its retry); when the train task succeeds, the night
joins its line."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from stoker.config.corpus import TrainConfig
from stoker.files import atomic_write_json
from stoker.layout import LineLayout, NightFiles, TrainerFiles
from stoker.lines.lease import LeaseHolder, give_back_lease, hand_over_lease, lease_file, take_lease
from stoker.lines.nights import Parent, Role, night_record
from stoker.lines.parents import check_agreement, choose_parent
from stoker.lines.promotion import promote
from stoker.run.tokenizer import TokenizerFacts, tokenizer_facts

log = logging.getLogger("stoker.lines")


def _fail(e: Exception) -> Exception:
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(str(e))  # a retry cannot fix a config or a line decision


def check_before_publish(cfg: Any, ds: str) -> Parent:
    """Choose the night's parent and check that the corpus tokenizer fits the model it continues, before any data
    moves. A missing tokenizer file is left to the Spark job, which says how to make it."""
    from stoker import paths
    from stoker.exceptions import StokerError

    train = cfg.train
    try:
        parent = choose_parent(LineLayout.of(train.line), ds, cfg.name, train.init, train.older_nights)
        tok = paths.resolve_local(cfg.tokenizer.path)
        if tok.is_file():
            check_agreement(parent, tokenizer_facts(tok, cfg.tokenizer.eos_token, cfg.tokenizer.pad_token))
    except StokerError as e:
        raise _fail(e) from None
    log.info("night %s of line %s continues %s", ds, train.line, parent.describe())
    return parent


def _manifest_tokenizer(manifest: Any) -> TokenizerFacts:
    return TokenizerFacts(path=manifest.tokenizer_path, sha256=manifest.tokenizer_sha256,
                          vocab_size=manifest.vocab_size, eos_id=manifest.eos_id, pad_id=manifest.pad_id)


LEASE_WAIT_S = 20
"""How long a night whose line trains another night waits (up_for_reschedule, its pool slot given up)
before it looks again."""
_TASK_OVER = {"success", "failed", "skipped", "upstream_failed", "removed"}


def lease_holder_of(ti: Any, manifest: Any) -> LeaseHolder:
    return LeaseHolder(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, corpus=manifest.corpus,
                       ds=manifest.ds, topic=manifest.topic)


def _task_alive(holder: LeaseHolder) -> bool:
    """Whether the holder's train task can still run, from Airflow's own record (through the task SDK)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    states = RuntimeTaskInstance.get_task_states(dag_id=holder.dag_id, task_ids=[holder.task_id],
                                                 run_ids=[holder.run_id])
    run = states.get(holder.run_id) or {}
    if holder.task_id not in run:
        return False  # its run was deleted
    return run[holder.task_id] not in _TASK_OVER


def take_line_lease(train: TrainConfig, manifest: Any, ti: Any, alive: Any = None) -> None:
    """Hold the line's training lease from launch until the night joined its line (or its task failed for
    good). While another night of the line holds it, this task is rescheduled: it gives up the line's pool
    slot, so the holder (waiting for its slot to resume) can finish and join first."""
    holder = take_lease(LineLayout.of(train.line), lease_holder_of(ti, manifest), alive or _task_alive)
    if holder is not None:
        from datetime import UTC, datetime, timedelta

        from airflow.sdk.exceptions import AirflowRescheduleException

        log.info("line %s trains %s: night %s of %s waits for it to join the line (looks again in %d s; if that "
                 "run is gone without Airflow knowing, e.g. a killed `stoker refresh`, remove %s)", train.line,
                 holder.describe(), manifest.ds, manifest.corpus, LEASE_WAIT_S, lease_file(LineLayout.of(train.line)))
        raise AirflowRescheduleException(datetime.now(UTC) + timedelta(seconds=LEASE_WAIT_S))


def give_back_line_lease(train: TrainConfig, manifest: Any, ti: Any) -> None:
    if give_back_lease(LineLayout.of(train.line), lease_holder_of(ti, manifest)):
        log.info("line %s: night %s of %s gave back the training lease", train.line, manifest.ds,
                 manifest.corpus)


def hand_line_lease_to(train: TrainConfig, manifest: Any, ti: Any, task_id: str) -> None:
    if hand_over_lease(LineLayout.of(train.line), lease_holder_of(ti, manifest), task_id):
        log.info("line %s: night %s of %s hands the training lease to %s, which decides whether it is the head",
                 train.line, manifest.ds, manifest.corpus, task_id)


def launch_parent(train: TrainConfig, files: TrainerFiles, manifest: Any) -> Parent:
    """The night's parent and role chosen now, at this (re)launch, and the tokenizer the night was packed
    with checked against that parent; recorded in the trainer's folder. Where the parent differs from the
    one an earlier try trained from (another night joined the line in between), that try's checkpoints
    are removed: they hold weights of the old parent, and the night restarts from the new one."""
    import shutil

    from stoker.exceptions import StokerError

    try:
        parent = choose_parent(LineLayout.of(train.line), manifest.ds, manifest.corpus, train.init, train.older_nights)
        check_agreement(parent, _manifest_tokenizer(manifest))
    except StokerError as e:
        raise _fail(e) from None
    before = Parent.from_dict(json.loads(files.parent.read_text())) if files.parent.is_file() else None
    if before is not None and (before.kind, before.path) != (parent.kind, parent.path):
        log.warning("line %s moved since night %s last launched: it continued %s, now %s; its checkpoints "
                    "(trained from the old parent) are removed and it restarts", train.line, manifest.ds,
                    before.describe(), parent.describe())
        shutil.rmtree(files.checkpoints, ignore_errors=True)
    elif before is not None and before.role != parent.role:
        log.warning("line %s moved since night %s last launched: the night is now a %s of the line",
                    train.line, manifest.ds, parent.role)
    files.folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(files.parent, parent.to_dict())
    return parent


def prepare_replay(train: TrainConfig, files: TrainerFiles, manifest: Any, parent: Parent,
                   kafka_config: dict[str, Any]) -> dict[str, Any] | None:
    """``train.replay``: the rows of the line's earlier nights this night mixes in (:mod:`stoker.lines.replay`), drawn
    and read at its first launch from the parent's lineage, kept in the trainer's folder for its relaunches
    (drawn again only when the parent changed, and then its checkpoints were removed too). None: no replay
    (the line's first night, a Hugging Face start, or ``replay: 0``)."""
    from stoker.lines import replay
    from stoker.lines.nights import read_night
    from stoker.lines.replay_rows import remove_rows

    if train.replay <= 0 or parent.kind != "night":
        remove_rows(files.replay)
        files.replay_draw.unlink(missing_ok=True)
        return None
    def store_of(entry: dict[str, Any]) -> Path:
        night = LineLayout.of(train.line).night(str(entry.get("ds")), str(entry.get("corpus")))
        return night.replay_store if night.replay_store.exists() else night.replay_store_legacy

    done = replay.prepare(kafka_config, read_night(NightFiles(Path(parent.path))),
                          {"kind": parent.kind, "path": parent.path}, manifest, train.replay, files.replay,
                          files.replay_draw, store_of)
    if done is not None:
        log.info("night %s replays %d sequences of %d earlier night(s) of line %s (train.replay %s, drawn %d, read in "
                 "%.1f s): %s", manifest.ds, done["replayed"], len(done["nights"]), train.line, train.replay,
                 done["drawn"], done["seconds"], files.replay_draw)
    return done


def keep_replay_store(train: TrainConfig | None, manifest: Any, files: TrainerFiles,
                      kafka_config: dict[str, Any]) -> None:
    """A night of a replaying line, done training: its rows for the line's replay store, read from its topic
    now (``join_line`` puts them in its night folder)."""
    from stoker.lines import replay

    if train is None or train.replay <= 0:
        return
    kept = replay.keep_store(kafka_config, manifest, train.replay, files.replay_store)
    log.info("night %s of %s leaves %d of its sequences to line %s's replay store", manifest.ds, manifest.corpus,
             kept, train.line)


def init_args(parent: Parent) -> list[str]:
    """The trainer's start: the parent decided at this launch (the rest of the line's settings are in the plan)."""
    return ["--init-from", parent.path] if parent.kind in ("night", "hf") else []


def join_line(train: TrainConfig, manifest: Any, files: TrainerFiles, holdout: Path | None = None) -> NightFiles:
    """The night finished: its final checkpoint, export, model card and record go into its line. Its role
    is checked once more: a night whose parent is no longer what the line would give it (two nights of a
    line trained at once, without the line's pool) joins as a branch, never as a head that skips a night."""
    parent = Parent.from_dict(json.loads(files.parent.read_text()))
    now = choose_parent(LineLayout.of(train.line), manifest.ds, manifest.corpus, train.init, "branch")
    role = now.role if (now.kind, now.path) == (parent.kind, parent.path) else Role.BRANCH
    if role != parent.role:
        log.warning("night %s of %s joins line %s as a %s: the line moved while it trained (parent %s, the line "
                    "now gives %s)", manifest.ds, manifest.corpus, train.line, role, parent.describe(),
                    now.describe())
        parent.role = role
    summary = json.loads(files.summary.read_text())
    night = night_record(manifest, summary, parent)
    export = Path(summary.get("export") or files.export)
    done = promote(LineLayout.of(train.line), night, files.checkpoints, export, holdout, trunk=files.trunk,
                   replay_store=files.replay_store)
    (export / "README.md").unlink(missing_ok=True)  # the run's own export carries the card too (a new file:
    (export / "README.md").write_text(done.card.read_text())  # never written through a link into the line)
    log.info("night %s of %s joined line %s as its %s (parent: %s); model card %s", manifest.ds, manifest.corpus,
             train.line, parent.role, parent.describe(), done.card)
    return done
