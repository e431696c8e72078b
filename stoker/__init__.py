"""Stoker's shared contracts: what every surface (an Airflow deployment, a Spark cluster, a training node)
deploys and agrees on. Nothing here imports Airflow, Spark or torch at module level, and nothing here starts
a service: the embedded stack a laptop runs is ``stoker_local``, which no cluster node installs.

The package is one subpackage per room and a few modules every room uses. The map below is kept true by
``tests/unit/test_module_map.py`` (every module listed, nothing listed that is gone); each module's own
docstring says the rest, and ``docs/development.md`` shows the whole tree.

Shared by every room:
    stoker.exceptions           named errors whose messages say the value, the limit and what to change
    stoker.paths                where Stoker keeps things: the checkout, the state folder, the user's cache
    stoker.files                a JSON file replaced atomically, a file's sha256
    stoker.layout               every name and path of a run, a trainer and a line; no surface spells another's
    stoker.process              a process found again from its record; the heartbeat that crosses hosts

stoker.config: what a person writes
    stoker.config.corpus        ``corpora/<name>.yaml`` as validated dataclasses
    stoker.config.quality       its ``quality:`` block: the document filters and PII scrubbing
    stoker.config.eval          its ``eval:`` block: held-out share, the gate's floors, review
    stoker.config.recipes       named training recipes and recipe YAMLs
    stoker.config.line          ``corpora/lines/<name>.yaml``: a line's mixture of its corpora and its deadline
    stoker.config.schema        YAML mappings into dataclasses, every key and type checked
    stoker.config.reference     docs/config.md, generated from the dataclasses

stoker.run: one night of one corpus, as the files every stage trusts
    stoker.run.plan             the run plan: config + params + names + parent, decided once
    stoker.run.manifest         the manifest: the run's commit point
    stoker.run.records          the Kafka wire format of one packed sequence
    stoker.run.reasons          drop reasons by step, and the drop-rate alarm
    stoker.run.holdout          which documents a night holds out, and their files
    stoker.run.tokenizer        the tokenizer's facts (sha256, ids) read without the library

stoker.kafka: Kafka as Stoker uses it
    stoker.kafka.clients        clients by role, one reused admin client per cluster
    stoker.kafka.settings       Stoker's own keys in a client config (password files, callables)
    stoker.kafka.topics         topics: reachable, listed, created, awaited, deleted
    stoker.kafka.offsets        end, start and committed offsets; committing; reading a topic whole
    stoker.kafka.lag            a run's consumer lag (arithmetic only)

stoker.stores: where a drop lives
    stoker.stores.base          what every store answers with
    stoker.stores.local         a local folder, and Spark's rule for data files
    stoker.stores.s3            S3 through boto3, and Spark's ``fs.s3a.*`` settings
    stoker.stores.hdfs          HDFS through WebHDFS
    stoker.stores.drops         a URI's store, and whether the night's drop is complete
    stoker.stores.connectors    the S3A jars ``make setup`` resolves from Maven Central

stoker.lines: model lines
    stoker.lines.nights         a line's nights, their records and their rules
    stoker.lines.ledger         the one writer of a line's records: states, head, invariants
    stoker.lines.parents        what a night starts from, and whether its tokenizer fits
    stoker.lines.promotion      a finished night recorded in its line, and its model card
    stoker.lines.lease          one night of a line trains at a time
    stoker.lines.gate           the promotion gate and people's decisions
    stoker.lines.eval_sets      the held-out sets a night is scored on, and its baseline
    stoker.lines.replay         earlier nights' sequences mixed into a night
    stoker.lines.replay_rows    replay rows on disk: streamed in, memory-mapped out
    stoker.lines.mixture        a night over several corpora at target shares: its rows and their order
    stoker.lines.mix_plan       a mixture night's plan: its manifests and rows, written once, and its deadline

stoker.reports: what people read
    stoker.reports.runs         a run's summary
    stoker.reports.catalog      every run folder and line, with state and why
    stoker.reports.check        ``stoker check``: a night's preconditions in seconds
    stoker.reports.gc           ``stoker gc``: retention, dry-run first
    stoker.reports.dropplot     the run page's drops chart and samples
    stoker.reports.lineplot     the run page's line chart
    stoker.reports.mixplot      the run page's chart of a mixture night's realised shares
"""

__version__ = "0.1.0"
