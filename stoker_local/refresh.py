"""``stoker refresh <corpus>``: one night through Airflow, from a terminal.

With the local stack down, ``airflow dags test`` runs the night here against the stack's metadata
database (so ``make up``'s UI lists it later, and the lines' pools span both); with the stack up, its
scheduler runs the night and this terminal follows it (:mod:`stoker_local.stack_refresh`). Either way
one live line per stage, then the run summary; Ctrl-C stops what the refresh started.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.exceptions import StokerError
from stoker.layout import RunLayout
from stoker.reports import runs
from stoker.run.plan import refresh_dag
from stoker_local import broker as kbroker


def run_conf(corpus: str, ds: str, given: list[str]) -> dict[str, Any]:
    """``--param NAME=VALUE`` as the Airflow run's conf, checked now as the publish task will (the run plan):
    a bad name or value fails before the broker or Airflow start."""
    from stoker.run.plan import plan_run

    conf: dict[str, Any] = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep:
            raise StokerError(f"--param {item!r}: write NAME=VALUE, e.g. seq_len=512")
        conf[name.strip()] = value
    plan = plan_run(paths.corpora_dir() / f"{corpus}.yaml", ds, conf)
    return {k: plan.params[k] for k in conf}  # typed: the DAG's params form checks the type


def refresh(args: argparse.Namespace) -> int:
    import time

    from stoker_local.progress import RunWatcher, follow, log_tail

    ds = args.ds or datetime.now(UTC).date().isoformat()
    given = list(args.param)
    if not any(g.partition("=")[0].strip() == "review" for g in given):  # a held night: decided, never asked
        given.append(f"review={getattr(args, 'decision', 'hold')}")
    conf = run_conf(args.corpus, ds, given)
    run = RunLayout.of(args.corpus, ds)
    from stoker_local import services

    if services.scheduler_up():
        return _refresh_on_stack(args.corpus, ds, conf, run, getattr(args, "decision", "hold"))
    log = run.logs / f"refresh-{datetime.now(UTC):%Y%m%dT%H%M%S}.log"
    since = time.time()
    kbroker.up()
    env = refresh_env(log)
    airflow = [sys.executable, "-m", "airflow"]
    dag = refresh_dag(args.corpus)
    cmd = [*airflow, "dags", "test", dag, ds, *(["--conf", json.dumps(conf)] if conf else [])]
    try:
        if args.verbose:
            rc = subprocess.run(cmd, env=env).returncode
        else:
            print(f"{dag} {ds}: Airflow, Spark and trainer logs in {log.parent}/ (--verbose shows "
                  "them)")
            rc = follow(cmd, env, log, RunWatcher(run, since))
    except KeyboardInterrupt:
        stopped = stop_trainers(run)
        give_back_line_lease(args.corpus, ds)
        print(f"\n{dag} {ds} interrupted: Airflow's run and its Spark job stopped"
              + (f", the trainer stopped ({len(stopped)} process(es))" if stopped else "")
              + f". What was done stays in {run.run_dir}; `stoker refresh {args.corpus} --ds {ds}` runs the night "
              "again (a published night is not published twice; training resumes from its last checkpoint).",
              file=sys.stderr)
        return 130
    if rc != 0:
        if not args.verbose:
            print(log_tail(log), file=sys.stderr)
        print(f"{dag} {ds} failed (exit {rc}); full log: {log}", file=sys.stderr)
        return rc
    print()
    print(runs.render(runs.summary(run.run_dir)))
    if not args.verbose:
        print(f"  logs             {log}")
    apply_decision(run, getattr(args, "decision", "hold"))
    return 0


def apply_decision(run: RunLayout, choice: str) -> None:
    """A night the gate held: the ``--decision`` given on the command line (default hold), never a question on
    the terminal; the figures that stopped it were printed with the summary."""
    import getpass

    from stoker.layout import LineLayout
    from stoker.lines.gate import human_decision
    from stoker.lines.nights import read_night
    from stoker.run.manifest import read_manifest
    from stoker.run.plan import read_plan

    if not run.evaluation.is_file():
        return
    decision = json.loads(run.evaluation.read_text()).get("decision") or {}
    if decision.get("decision") != "held":
        return
    m = read_manifest(run.run_dir)
    line = read_plan(run.plan).corpus.train.line or m.corpus
    print(f"held by the gate: {decision.get('why')}")
    now = (read_night(LineLayout.of(line).night(m.ds, m.corpus)).get("decision") or {})
    if now.get("by", "gate") != "gate":  # the run's review step decided already (the run's eval.review)
        print(f"  night {m.ds}.{m.corpus} of line {line} is now {now['decision']} ({now['by']})")
        return
    if choice == "hold":
        print(f"  the line's head stays; to promote it anyway: stoker lines decide {line} {m.ds}.{m.corpus} promote")
        return
    from stoker.config.eval import check_decider

    user = check_decider(read_plan(run.plan).corpus.eval.reviewers, getpass.getuser(), choice)
    done = human_decision(LineLayout.of(line), m.ds, m.corpus, choice, f"{user} (stoker refresh --decision {choice})")
    print(f"  --decision {choice}: night {m.ds}.{m.corpus} of line {line} is now {done['decision']}")


def _refresh_on_stack(corpus: str, ds: str, conf: dict[str, Any], run: RunLayout, decision: str) -> int:
    """The stack is up: its scheduler runs the night; this terminal follows it (stoker_local/stack_refresh.py)."""
    import time

    from stoker_local import services, stack_refresh
    from stoker_local.progress import LiveLine, RunWatcher

    api, dag = stack_refresh.StackApi(services.default_stack()), refresh_dag(corpus)
    since = time.time()
    run_id = stack_refresh.start_night(api, dag, ds, conf, print)
    watcher, live = RunWatcher(run, since), LiveLine()
    page = f"{api.base}/dags/{dag}/runs/{run_id}"
    try:
        answered: list[str] = []

        def show() -> None:
            if not answered and stack_refresh.answer_review(api, dag, run_id, decision, live.say):
                answered.append(decision)
            live.show(*watcher.line(time.time()), time.time())
        state = stack_refresh.follow_run(api, dag, run_id, show)
    except KeyboardInterrupt:
        stack_refresh.stop_run(api, dag, run_id)
        stopped = stop_trainers(run)
        print(f"\n{dag} {ds} interrupted: its run on the stack marked failed"
              + (f", the trainer stopped ({len(stopped)} process(es))" if stopped else "")
              + f"; `stoker refresh {corpus} --ds {ds}` runs it again", file=sys.stderr)
        return 130
    finally:
        live.close()
    if state != "success":
        failed = ", ".join(stack_refresh.failed_tasks(api, dag, run_id)) or "?"
        print(f"{dag} {ds} failed on the stack's scheduler: {failed}; logs in the UI: {page}", file=sys.stderr)
        return 1
    print()
    print(runs.render(runs.summary(run.run_dir)))
    print(f"  in the UI        {page}")
    apply_decision(run, decision)
    return 0


def refresh_env(log: Path) -> dict[str, str]:
    """The stack's metadata database (started if need be), migrated, with the lines' pools and the legacy
    assets retired; what it did goes to the refresh's log."""
    from stoker_local import services

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        env = services.refresh_env(log=lambda line: print(line, file=out, flush=True))
        subprocess.run([sys.executable, "-m", "stoker_local.airflow_env", "retire-legacy-assets"], env=env,
                       check=True, stdout=out, stderr=subprocess.STDOUT)
    return env


def give_back_line_lease(corpus: str, ds: str) -> None:
    """An interrupted test run leaves its task `running` in the database (no scheduler marks it over): the
    line's training lease it holds would keep the line's next night waiting, so it is given back here."""
    from stoker.config.corpus import load_corpus
    from stoker.layout import LineLayout
    from stoker.lines.lease import give_back_lease, lease_holder

    try:
        line = LineLayout.of(load_corpus(paths.corpora_dir() / f"{corpus}.yaml").train.line)
        holder = lease_holder(line)
    except StokerError:
        return
    if holder is not None and (holder.corpus, holder.ds) == (corpus, ds):
        give_back_lease(line, holder)


def stop_trainers(run: RunLayout) -> list[int]:
    """Stop every trainer of this run on this host: it runs detached from the terminal (its own session,
    each rank too), so Ctrl-C reaches Airflow and Spark but not it. Its processes carry its folder as tag."""
    from stoker.layout import TrainerFiles
    from stoker.process import stop_tagged

    stopped: list[int] = []
    for folder in sorted(p for p in run.train_dir.glob("*") if p.is_dir()):
        files = TrainerFiles(folder)
        pid = files.process.pid()
        stopped += stop_tagged(str(folder), grace=15)
        if files.process.stop(grace=15) and pid is not None and pid not in stopped:
            stopped.append(pid)
    return stopped
