"""The command line, ``python -m neardup.spark dedup`` (:func:`main`): its
flags, the Spark session (:func:`_session`), the input read as the CLI
reads it, :func:`neardup.spark.dedup`, the outputs written, and one clear
line for an error (exit code 2).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional

import neardup

from .candidates import MAX_GROUP
from .pipeline import dedup
from .read import _file_key, read_records
from .report import _log, _write_report
from .writing import write


def _session(master: Optional[str], driver_memory: Optional[str] = None, share_classes: bool = False) -> tuple:
    """The Spark session, and a function to call once the job is done (or
    None): with a local master and ``share_classes`` it ends the JVM and
    keeps the classes it loaded for the next run (:func:`_shared_classes`).
    A local session's JVM compiles with C1 only, unless
    ``PYSPARK_SUBMIT_ARGS`` gives it options of its own, and has a quarter
    of the machine's memory unless given (:func:`_local_memory`)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    new_jvm = SparkContext._active_spark_context is None
    submit = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if master is None and new_jvm and not _master_given():
        master = "local[*]"  # spark-submit's default, with a local session's settings
    b = SparkSession.builder.appName("neardup dedup")
    finish = None
    if master:
        b = b.master(master)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            b = b.config("spark.ui.enabled", "false")
            if new_jvm and driver_memory is None and "driver-memory" not in submit and "spark.driver.memory" not in submit:
                driver_memory = _local_memory()  # the tasks run in this JVM
            if new_jvm and "extraJavaOptions" not in submit:
                # The JVM moves Arrow batches and shuffle blocks; the work is
                # in the Python workers. Its optimising compiler (C2) costs
                # more CPU than it saves: compiled by C1 alone, 1 GB takes
                # 0.83x the time, 4 GB 0.97x.
                options = ["-XX:TieredStopAtLevel=1"]
                if share_classes:
                    option, finish = _shared_classes()
                    options.append(option)
                b = b.config("spark.driver.extraJavaOptions", " ".join(o for o in options if o))
    if driver_memory:
        b = b.config("spark.driver.memory", driver_memory)
    b = b.config("spark.sql.execution.arrow.pyspark.enabled", "true").config("spark.ui.showConsoleProgress", "false")
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark, (lambda: _end_jvm(spark, finish)) if finish is not None else None


def _local_memory() -> str:
    """A local session's JVM heap, where the tasks run: a quarter of the
    machine's memory, from 1 to 8 GB (with Spark's default of 1 GB the 4 GB
    corpus took 1.05x the time: the join's shuffle spills, the collector
    runs more often)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "1g"
    return f"{max(1, min(8, total // 4 >> 30))}g"


def _master_given() -> bool:
    """Whether Spark has a master from elsewhere: run by ``spark-submit`` (its
    JVM already up), ``--master`` in ``PYSPARK_SUBMIT_ARGS``, or
    ``spark.master`` in ``spark-defaults.conf``."""
    if "PYSPARK_GATEWAY_PORT" in os.environ or "--master" in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return True
    folder = os.environ.get("SPARK_CONF_DIR") or (os.path.join(os.environ["SPARK_HOME"], "conf") if "SPARK_HOME" in os.environ else None)
    if folder is None:
        return False
    try:
        with open(os.path.join(folder, "spark-defaults.conf")) as f:
            return any(line.split()[:1] == ["spark.master"] for line in f)
    except OSError:
        return False


def _shared_classes() -> tuple:
    """Class data sharing for a local session's JVM: the classes Spark loads,
    mapped from an archive instead of read and checked one by one (the
    session starts about 3 s sooner). The first run with a given Java and
    Spark writes the archive (about 150 MB, in ``$XDG_CACHE_HOME/neardup``
    or ``~/.cache/neardup``) when its JVM ends; later ones share it. Returns
    the JVM option, or "" (``NEARDUP_SPARK_SHARED_CLASSES=0``, or no
    folder to keep it in), and a function that puts a new archive in place
    once the JVM has ended, or None."""
    import hashlib
    import shutil

    import pyspark

    if os.environ.get("NEARDUP_SPARK_SHARED_CLASSES", "1") == "0":
        return "", None
    home = os.environ.get("JAVA_HOME")
    java = shutil.which("java", path=os.path.join(home, "bin") if home else None)
    if java is None:
        return "", None
    java = os.path.realpath(java)
    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    jars = os.path.join(spark_home, "jars")
    # The archive holds for this Java and these jars only.
    ident = repr((java, os.stat(java).st_mtime_ns, pyspark.__version__, spark_home,
                  sorted(os.listdir(jars)) if os.path.isdir(jars) else []))
    folder = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "neardup")
    archive = os.path.join(folder, f"spark-classes-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.jsa")
    quiet = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # the classes it cannot share are no news
    if os.path.isfile(archive):
        return f"-XX:SharedArchiveFile={archive} {quiet}", None
    try:
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            # An archive a run did not finish (killed as its JVM wrote it).
            old = os.path.join(folder, name)
            if name.startswith("spark-classes-") and name.endswith(".tmp") and os.path.getmtime(old) < time.time() - 3600:
                os.remove(old)
    except OSError:
        return "", None
    if not os.access(folder, os.W_OK):
        return "", None
    written = f"{archive}.{os.getpid()}.tmp"

    def finish():
        if os.path.isfile(written) and os.path.getsize(written) > 0:
            os.replace(written, archive)
        elif os.path.exists(written):
            os.remove(written)

    return f"-XX:ArchiveClassesAtExit={written} {quiet}", finish


def _end_jvm(spark: Any, then: Any) -> None:
    """Stops the session, ends its JVM (which writes its archive of classes
    as it exits) and waits for it, at most a minute, then calls ``then``."""
    gateway = spark.sparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return
    try:
        gateway.shutdown()
        if proc.stdin is not None:
            proc.stdin.close()  # the JVM exits when its Python driver is gone
        proc.wait(timeout=60)
    except Exception:  # noqa: BLE001 - the archive is an optimisation only
        return
    then()


def _error_message(e: BaseException) -> str:
    """The neardup message inside a Spark task failure, else the error."""
    import re

    text = str(e)
    m = re.search(r"NeardupError: (.*)", text)
    return m.group(1).strip() if m else text.splitlines()[0] if text else type(e).__name__


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neardup.spark", description="Near-duplicate detection on Apache Spark, with the answers of `neardup dedup`.")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dedup", help="pairs, clusters and deduplicated records of a corpus")
    d.add_argument("--input", required=True, nargs="+", help="JSON Lines (.gz too) or Parquet files or folders")
    d.add_argument("--output", required=True, help="output folder: pairs/, clusters/, deduped/")
    d.add_argument("--input-format", choices=["auto", "jsonl", "parquet"], default="auto")
    d.add_argument("--output-format", "--format", dest="format", choices=["parquet", "jsonl"], default="parquet",
                   help="format of the outputs (as neardup dedup --output-format; --format is its older spelling)")
    d.add_argument("--id-field", default="id")
    d.add_argument("--text-field", default="text")
    d.add_argument("--k", type=int)
    d.add_argument("--verify", help="jaccard:T (default jaccard:0.8)")
    d.add_argument("--no-verify", action="store_true", help="decide by Hamming distance alone")
    d.add_argument("--no-centre", action="store_true", help="candidates from plain fingerprints, not centred on the corpus (as neardup dedup --no-centre)")
    d.add_argument("--policy", choices=["components", "incremental"], default="components")
    d.add_argument("--keep-by", default="first", help="first, longest or field:NAME[:asc|desc]")
    d.add_argument("--against", nargs="+", help="documents already clean: pairs with them are reported, they are never removed")
    d.add_argument("--config", help="a configuration file (neardup config)")
    d.add_argument("--profile", choices=["native", "python-simhash"])
    d.add_argument("--bits", type=int, choices=[64, 128])
    d.add_argument("--features", help="tokens, shingles:W or ngrams:N")
    d.add_argument("--tokenizer", choices=["auto", "words", "jieba", "chars"])
    d.add_argument("--weights", choices=["tf", "binary", "tfidf", "textrank"])
    d.add_argument("--idf", help="an IDF table from `neardup idf build` (implies --weights tfidf), shipped to the executors")
    d.add_argument("--top", type=int)
    d.add_argument("--hash", choices=["xxh3", "fnv1a", "md5", "siphash"])
    d.add_argument("--seed", type=int)
    d.add_argument("--stopwords", action="store_true")
    d.add_argument("--html", action="store_true")
    d.add_argument("--skip-invalid", action="store_true", help="skip malformed records and count them, instead of failing")
    d.add_argument("--no-pairs", action="store_true",
                   help="write clusters and records only: with --policy components, only the pairs that span "
                        "the clusters are verified (a cluster of m copies costs about m checks, not m^2/2)")
    d.add_argument("--driver-documents", type=int, metavar="N",
                   help="join on the driver up to N documents (about 175 bytes of driver memory each), else in the "
                        "executors; default: in the executors, except for what only the driver join does (--policy "
                        "incremental, --idf, --features-field, --annotate), up to 20,000,000 documents")
    d.add_argument("--max-group", type=int, default=MAX_GROUP,
                   help="distributed path: split join groups of more rows than this into block pairs (skew)")
    d.add_argument("--vector-column", help="dedup dense vectors (an array of numbers) in this column instead of texts")
    d.add_argument("--min-similarity", type=float,
                   help="with --vector-column or --features-field: the cosine threshold (default 0.95); for weighted "
                        "features, k is the largest distance whose estimated similarity reaches it")
    d.add_argument("--features-field", nargs="?", const="features", metavar="NAME",
                   help="documents are weighted features in this field (column), an object (map) of feature -> weight, "
                        "instead of texts (--features-field alone: the field \"features\"), as neardup dedup --features-field")
    d.add_argument("--annotate", action="store_true",
                   help="also write annotated/: every record, kept or not, with \"cluster\", \"duplicate_of\" and "
                        "\"similarity\" added (as neardup dedup --annotate; columns added to Parquet rows)")
    d.add_argument("--spill-dir", metavar="DIR",
                   help="a folder every executor can write and read, where the fingerprint pass keeps each document's "
                        "feature set for the exact check (default: in local mode a temporary folder; on a cluster "
                        "whose executors read the input, a temporary folder beside --output when it is a path, not "
                        "a URL; else the check reads its documents again)")
    d.add_argument("--report", metavar="FILE",
                   help="write a JSON report: per stage its seconds, rows and bytes shuffled (per document too), "
                        "and the driver's peak memory")
    d.add_argument("--master", help="Spark master, e.g. local[2] (default: spark-submit's, else local[*])")
    d.add_argument("--driver-memory", help="e.g. 4g (local mode, where the tasks run in the driver's JVM; default a quarter "
                                           "of the machine's memory, 1 to 8 GB; under spark-submit use its own flag)")
    d.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    quiet = args.quiet

    def fail(msg):
        print(f"neardup.spark: error: {msg}", file=sys.stderr)
        return 2

    for path in args.input + (args.against or []):
        if "://" not in path and not os.path.exists(path):
            return fail(f"{path}: no such file or folder")
    fmt = args.input_format
    if fmt == "auto":
        fmt = "parquet" if all(p.rstrip("/").endswith(".parquet") for p in args.input) else "jsonl"
    if args.vector_column and (args.against or args.policy != "components" or args.keep_by != "first"):
        return fail("--vector-column takes --policy components and --keep-by first, without --against")
    if args.features_field and args.against:
        return fail("--against takes texts; deduplicate weighted features without it (as neardup dedup)")
    if args.vector_column and (args.features_field or args.annotate):
        return fail("--vector-column takes neither --features-field nor --annotate")
    if args.min_similarity is not None and not (args.vector_column or args.features_field):
        return fail("--min-similarity goes with --vector-column or --features-field (texts: use --k)")
    verify = False if args.no_verify else (True if args.verify is None else args.verify)
    kwargs = {
        k: v
        for k, v in [
            ("bits", args.bits), ("features", args.features), ("tokenizer", args.tokenizer), ("weights", args.weights),
            ("seed", args.seed), ("top", args.top), ("hash", args.hash), ("profile", args.profile),
            ("stopwords", True if args.stopwords else None), ("html", True if args.html else None),
        ]
        if v is not None
    }
    config = None
    if args.config:
        # Flags given as well override its settings, as with `neardup dedup`.
        try:
            config = neardup.FingerprintConfig.load(args.config, idf=args.idf)
        except (OSError, ValueError) as e:
            return fail(f"{args.config}: {e}")
    spark, end = _session(args.master, args.driver_memory, share_classes=True)
    try:
        return _run_dedup(spark, args, fmt, verify, kwargs, config, quiet, fail)
    finally:
        if end is not None:
            end()


def _spill_dir(spark: Any, given: Optional[str], output: str, splits: Any) -> Optional[str]:
    """Where the fingerprint pass keeps the feature sets: ``given``; else on
    a cluster whose executors read the input themselves and write an output
    on disk, beside the output folder (which every executor writes, so its
    file system is one they all mount); else None (in local mode a
    temporary folder of the machine, on a cluster the check reads its
    documents again)."""
    if given is not None or splits is None or spark.sparkContext.master.startswith("local"):
        return given
    if "://" in output and not output.startswith("file:"):
        return None
    parent = os.path.dirname(os.path.abspath(_file_key(output)))
    os.makedirs(parent, exist_ok=True)
    return parent


def _run_dedup(spark: Any, args: Any, fmt: str, verify: Any, kwargs: dict, config: Any, quiet: bool, fail: Any) -> int:
    """The job of ``main``'s arguments in session ``spark``: exit code 0, or
    ``fail``'s for an error."""
    started = time.monotonic()
    try:
        if args.vector_column:
            df = spark.read.parquet(*args.input) if fmt == "parquet" else spark.read.json(args.input)
            for col in (args.id_field, args.vector_column):
                if col not in df.columns:
                    return fail(f"the input has no {col!r} column (columns: {df.columns}); use --id-field/--vector-column")
            kw = {k: v for k, v in kwargs.items() if k in ("bits", "seed")}
            result = dedup(spark, df, id_col=args.id_field, k=args.k, verify=verify,
                           max_group=args.max_group, vector_col=args.vector_column, min_similarity=args.min_similarity, **kw)
        else:
            records, positions, splits = read_records(spark, args.input, fmt, args.against)
            if fmt == "parquet":
                for col in (args.id_field, args.features_field or args.text_field):
                    if col not in records.columns:
                        flag = "--features-field" if args.features_field else "--text-field"
                        return fail(f"the input has no {col!r} column (columns: {[c for c in records.columns if not c.startswith('_')]}); use --id-field/{flag}")
            result = dedup(
                spark, records, id_col=args.id_field, text_col=args.text_field,
                json_col="value" if fmt == "jsonl" else None, k=args.k,
                verify=verify, policy=args.policy, keep_by=args.keep_by,
                config=config, idf=args.idf, skip_invalid=args.skip_invalid, max_group=args.max_group,
                driver_documents=args.driver_documents, quiet=quiet, pairs=not args.no_pairs, positions=positions,
                splits=splits, centre=not args.no_centre, features_col=args.features_field,
                annotate=args.annotate, min_similarity=args.min_similarity,
                spill_dir=_spill_dir(spark, args.spill_dir, args.output, splits), **kwargs,
            )
        t = time.monotonic()
        try:
            took = write(result, args.output, args.format)
        finally:
            result.close()
        result.stages["write"] = time.monotonic() - t
        if args.report:
            _write_report(args.report, result, time.monotonic() - started)
    except Exception as e:  # noqa: BLE001 - one clear line, not a JVM trace
        if isinstance(e, (neardup.NeardupError, OSError, ValueError)) or "NeardupError" in str(e) or "AnalysisException" in type(e).__name__:
            return fail(_error_message(e))
        raise
    _log(quiet, f"write: {args.output} in {result.stages['write']:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in took.items())})")
    total = time.monotonic() - started
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in result.stages.items())
    if not quiet:
        print(f"neardup.spark: done in {total:.1f} s ({stages}); output in {args.output}", file=sys.stderr)
    return 0
