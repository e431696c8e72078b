"""MinHash-LSH near-dedup of a night against itself and against the corpus's earlier nights.

The signature is datatrove's (``MinhashDedupSignature``): the text simplified (lower case, digits as 0, no
punctuation, one space, no accents), split into words by spaCy's rule-based tokenizer, word n-grams hashed with
xxh64, and ``bands x hashes_per_band`` minima of the universal hashes ``(a x + b) mod 2^61 - 1`` drawn from
``numpy.random.RandomState(seed)``. Each band's hashes are folded into one 64-bit key (xxh64 of their bytes), so
two documents share a band exactly when datatrove's buckets would pair them.

The index pass adds a document's band keys to its index row. :func:`find_near_duplicates` explodes them,
adds the earlier nights' keys from the corpus's index (Parquet, a folder per night and corpus; only nights in
the weights of a line's head count: a night that failed, was held, rolled back or passed over holds no
document any model was trained on), groups by (band, key) and
joins every group's documents into clusters on the driver (union-find over the candidate edges only: a night's
near-duplicates, not its documents). Of each cluster the earliest document stays (an earlier night's first);
every document of this night after it is dropped, naming it. :func:`write_index` adds the night's kept
documents to the index once its publication is verified and its manifest built.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import numpy as np

from spark_jobs.punctuation import PUNCTUATION
from stoker.config.quality import NearDedupConfig
from stoker.exceptions import StokerError

MERSENNE = np.uint64((1 << 61) - 1)
NEAR_DUPLICATE = "near_duplicate"
_PUNCTUATION_TRANS = str.maketrans("".join(sorted(PUNCTUATION)), " " * len(PUNCTUATION))


def simplify(text: str) -> str:
    """datatrove's ``simplify_text`` with its default TextNormConfig."""
    import re

    import regex

    text = regex.sub(r"\p{Nd}+([.,،٫⎖⎗⎘]{1}\p{Nd}+)?", "0", text.lower())
    text = re.sub(r"\s+", " ", text.translate(_PUNCTUATION_TRANS).strip())
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn").strip()


class MinHasher:
    """Band keys of one text (None when it has fewer than ``n_grams`` words or characters)."""

    def __init__(self, config: NearDedupConfig, words: Any) -> None:
        self.c, self.words = config, words
        gen = np.random.RandomState(config.seed)
        n = config.bands * config.hashes_per_band
        self.a = gen.randint(1, MERSENNE, dtype=np.uint64, size=(1, n))
        self.b = gen.randint(0, MERSENNE, dtype=np.uint64, size=(1, n))

    def shingles(self, text: str) -> np.ndarray:
        import xxhash

        simple, n = simplify(text), self.c.n_grams
        if self.c.shingle == "chars":
            grams = [simple[i:i + n] for i in range(len(simple) - n + 1)]
        else:
            w = self.words(simple)
            grams = [" ".join(w[i:i + n]) for i in range(len(w) - n + 1)]
        hashes = (xxhash.xxh64_intdigest(g.encode()) for g in grams)  # UTF-8: xxhash 4 takes no non-ASCII str
        return np.fromiter(hashes, dtype=np.uint64, count=len(grams)).reshape(-1, 1)

    def signature(self, text: str) -> np.ndarray | None:
        """The ``bands x hashes_per_band`` minima, datatrove's ``get_signature`` (uint64)."""
        shingles = self.shingles(text)
        if shingles.size == 0:
            return None
        with np.errstate(over="ignore"):
            return np.min((shingles * self.a + self.b) % MERSENNE, axis=0)

    def bands(self, text: str) -> list[int] | None:
        import xxhash

        sig = self.signature(text)
        if sig is None:
            return None
        rows = sig.reshape(self.c.bands, self.c.hashes_per_band)
        return [xxhash.xxh64_intdigest(row.tobytes()) - (1 << 63) for row in rows]  # as a signed long


def _union_find(edges: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """Each node of ``edges`` → the smallest node of its connected component."""
    parent: dict[Any, Any] = {}

    def root(x: Any) -> Any:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {x: root(x) for x in parent}


def index_folder(cfg: Any) -> str:
    """The corpus's index folder, ``quality.near_dedup.index`` expanded, as Spark names it: ``file:/abs`` for a
    local folder, ``s3a://`` for ``s3://``, ``hdfs://`` as it is. Read and written through Hadoop's FileSystem,
    so the index can live in the same object store or HDFS as the corpus (a Spark cluster's executors write it)."""
    from spark_jobs.hadoop import spark_path
    from stoker.paths import expand

    return spark_path(expand(cfg.quality.near_dedup.index.replace("{corpus}", cfg.name)))


def near_duplicates(spark, cfg: Any, index: Any, dups: Any, ds: str, persisted: list[Any]) -> Any:
    """The night's exact duplicates (``dups``, or None) and its near-duplicates, as one frame of dropped records."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    kept = index.where(F.col("reason").isNull())
    if dups is not None:
        kept = kept.join(dups.select("source", "pos"), ["source", "pos"], "left_anti")
    near = find_near_duplicates(spark, kept, ds, index_folder(cfg), counted_nights()).persist(
        StorageLevel.MEMORY_AND_DISK)
    persisted.append(near)
    return near if dups is None else dups.unionByName(near)


def counted_nights() -> set[tuple[str, str]]:
    """The earlier nights whose documents count (:func:`stoker.lines.ledger.blessed_nights`, over this state's
    lines): those in a line head's weights."""
    from stoker import paths
    from stoker.lines.ledger import blessed_nights

    return blessed_nights(paths.state_dir() / "lines")


def find_near_duplicates(spark, kept, ds: str, index: str | None, nights: set[tuple[str, str]] | None = None) -> Any:
    """Near-duplicate records of this night (source, pos, reason, detail, raw), as a frame; ``kept`` holds the
    night's (source, pos, bands) after exact dedup, ``index`` the corpus's folder of earlier nights, of which
    only ``nights`` (ds, corpus) count (None: all)."""
    from pyspark.sql import functions as F

    docs = kept.select(F.lit(ds).alias("night"), "source", "pos", "bands").where(F.col("bands").isNotNull())
    earlier = _earlier_nights(spark, index, ds, nights)
    if earlier is not None:
        docs = docs.unionByName(earlier)
    doc = F.struct("night", "source", "pos")
    groups = (docs.select(doc.alias("doc"), F.posexplode("bands").alias("band", "key"))
              .groupBy("band", "key").agg(F.collect_set("doc").alias("docs"))
              .where((F.size("docs") > 1) & F.exists("docs", lambda d: d["night"] == F.lit(ds))))
    edges = []
    for row in groups.select("docs").toLocalIterator():
        members = sorted((d["night"], d["source"], d["pos"]) for d in row["docs"])
        edges += [(members[0], m) for m in members[1:]]
    rows = [(m[1], m[2], NEAR_DUPLICATE, f"near-duplicate of night {r[0]}, {r[1]} at {r[2]}", None)
            for m, r in sorted(_union_find(edges).items()) if m[0] == ds and r != m]
    return spark.createDataFrame(rows, "source string, pos long, reason string, detail string, raw binary")


def index_nights(spark, index: str) -> list[str]:
    """The complete folders of the index, one per night and corpus (``night=<ds>/corpus=<name>``, with Spark's
    ``_SUCCESS``: a write that died midway is never read), listed through Hadoop's FileSystem (a local folder,
    S3A, HDFS), oldest first. Keyed by corpus, several corpora share one index without one's night replacing
    another's of the same date. A folder of the layout before (``night=<ds>`` holding the files itself) is
    refused, naming the move that keeps it."""
    from spark_jobs.hadoop import configure_hadoop

    configure_hadoop(spark, index)
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(index)
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(root):
        return []
    found = []
    for night in (s.getPath() for s in fs.listStatus(root) if s.isDirectory()):
        if not night.getName().startswith("night="):
            continue
        if fs.exists(jvm.org.apache.hadoop.fs.Path(night, "_SUCCESS")):
            raise StokerError(f"near-dedup index {index}: {night.getName()} holds its files itself, the layout "
                              f"before corpora were keyed; move them to {night.getName()}/corpus=<its corpus>/")
        found += [f"{index.rstrip('/')}/{night.getName()}/{c.getPath().getName()}" for c in fs.listStatus(night)
                  if c.isDirectory() and c.getPath().getName().startswith("corpus=")
                  and fs.exists(jvm.org.apache.hadoop.fs.Path(c.getPath(), "_SUCCESS"))]
    return sorted(found)


def _folder_night(folder: str) -> tuple[str, str]:
    """(ds, corpus) of an index folder ``.../night=<ds>/corpus=<corpus>``."""
    night, corpus = folder.rstrip("/").rsplit("/", 2)[1:]
    return night.removeprefix("night="), corpus.removeprefix("corpus=")


def _earlier_nights(spark, index: str | None, ds: str, nights: set[tuple[str, str]] | None) -> Any:
    from pyspark.sql import functions as F

    folders = [f for f in index_nights(spark, index) if _folder_night(f)[0] < ds
               and (nights is None or _folder_night(f) in nights)] if index else []
    if not folders:
        return None
    frame = spark.read.schema("source string, pos long, bands array<long>").parquet(*folders)
    return frame.select(F.regexp_extract("_metadata.file_path", r"night=([0-9-]+)", 1).alias("night"),
                        "source", "pos", "bands")


def write_index(index: Any, dropped: Any, folder: str, ds: str, corpus: str) -> None:
    """The night's kept documents' band keys, as the index's folder ``night=<ds>/corpus=<corpus>`` (replaced on a
    re-run of this corpus's night; another corpus's night of the date is another folder)."""
    from spark_jobs.hadoop import configure_hadoop

    kept = index.where("reason is null and bands is not null")
    if dropped is not None:
        kept = kept.join(dropped.select("source", "pos"), ["source", "pos"], "left_anti")
    out = f"{folder.rstrip('/')}/night={ds}/corpus={corpus}"
    configure_hadoop(kept.sparkSession, folder)
    kept.select("source", "pos", "bands").coalesce(1).write.mode("overwrite").parquet(out)
