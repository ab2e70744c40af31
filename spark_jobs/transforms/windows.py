"""Silver's per-record work as DataFrame -> DataFrame steps (DESIGN §2, §4b).

Records carry ``ts_ms`` (the pipeline's time characteristic in epoch millis)
and ``version`` (the bronze commit that brought them: the micro-batch they
belong to). Windows are assigned in Spark SQL, every (record, window) pair is
judged against the watermark at the start of its micro-batch, and on-time pairs
are pre-aggregated per (window, key) into mergeable partial aggregates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.eventtime.model import CLOSED, FIRED, OPEN
from spark_jobs.eventtime.windows import WindowSpec
from spark_jobs.sql import is_in_sql
from spark_jobs.transforms.aggregates import partial_aggregates

TIME_COLUMNS = {"event": "event_time", "ingestion": "ingest_time", "processing": "processing_time"}


def is_fired(window_end_ms: Column, watermark: Column | int) -> Column:
    """Flink's firing rule (``eventtime.windows.is_fired``): the watermark reached
    the window's last millisecond, ``watermark >= end - 1``."""
    return window_end_ms - F.lit(1) <= watermark


def is_cleaned(window_end_ms: Column, watermark: Column | int, allowed_lateness_ms: int) -> Column:
    """Flink's cleanup rule (``eventtime.windows.is_cleaned``): the watermark passed
    the window's allowed lateness, ``watermark >= end - 1 + L``; a record for it is late."""
    return window_end_ms - F.lit(1) + F.lit(allowed_lateness_ms) <= watermark


def window_status(
    revision: Column, window_end_ms: Column, watermark: Column | int, allowed_lateness_ms: int
) -> Column:
    """The status a window with ``revision`` has at ``watermark``."""
    return (
        F.when(is_cleaned(window_end_ms, watermark, allowed_lateness_ms), F.lit(CLOSED))
        .when(revision >= 1, F.lit(FIRED))
        .otherwise(F.lit(OPEN))
    )


# The statuses of a window a micro-batch may still change: not closed. Silver is
# partitioned by status, so a batch reads and rewrites only these windows (DESIGN
# §4b); closed ones change only in the late merge.
IN_PLAY_STATUSES = frozenset({OPEN, FIRED})


def in_play_sql(status: str = "status") -> str:
    """A window in play (:data:`IN_PLAY_STATUSES`), as SQL (a commit's predicate);
    ``status`` names the column."""
    return is_in_sql(status, sorted(IN_PLAY_STATUSES))


def in_play(status: str = "status") -> Column:
    """:func:`in_play_sql` as a Column."""
    return F.expr(in_play_sql(status))


def record_millis(config: PipelineConfig) -> Column:
    """The timestamp windows and watermarks run on, per the time characteristic."""
    return F.unix_millis(F.col(TIME_COLUMNS[config.time_characteristic]))


def is_marker(config: PipelineConfig) -> Column:
    """Punctuated markers carry a watermark in their timestamp and are not data."""
    marker = config.watermark.marker_column
    return F.col(marker).isNotNull() if marker else F.lit(False)


def _last_start(spec: WindowSpec) -> Column:
    ts = F.col("ts_ms")
    return ts - F.pmod(ts - F.lit(spec.offset_ms), F.lit(spec.slide_ms))


def _window_starts(spec: WindowSpec) -> Column:
    """Every start of a window holding ``ts_ms``, latest first (sliding windows)."""
    return F.sequence(_last_start(spec), F.col("ts_ms") - F.lit(spec.size_ms - 1), F.lit(-spec.slide_ms))


def assign_windows(records: DataFrame, spec: WindowSpec) -> DataFrame:
    """One row per (record, window it belongs to), with ``window_start_ms`` and
    ``window_end_ms``. The start uses the floor-mod form (``pmod``), so negative
    timestamps land in the right window; sliding windows explode every start
    from the latest down to the earliest that still contains the record."""
    start = _last_start(spec) if spec.is_tumbling else F.explode(_window_starts(spec))
    return records.withColumn("window_start_ms", start).withColumn(
        "window_end_ms", F.col("window_start_ms") + F.lit(spec.size_ms)
    )


def windows_per_record(spec: WindowSpec) -> Column:
    """How many windows hold the record (the rows :func:`assign_windows` makes of it)."""
    return F.lit(1) if spec.is_tumbling else F.size(_window_starts(spec))


def judge_pairs(
    pairs: DataFrame, watermarks_before: Mapping[int, int], allowed_lateness_ms: int
) -> DataFrame:
    """Add ``watermark`` (the pipeline watermark when the pair's batch started:
    :func:`with_starting_watermark`) and ``is_late``: the window was already cleaned
    (watermark >= end - 1 + L)."""
    return with_starting_watermark(pairs, watermarks_before).withColumn(
        "is_late", is_cleaned(F.col("window_end_ms"), F.col("watermark"), allowed_lateness_ms)
    )


def with_starting_watermark(rows: DataFrame, watermarks_before: Mapping[int, int]) -> DataFrame:
    """``rows`` (each of a bronze ``version``) with ``watermark``: the one its version
    started at, from ``watermarks_before`` (version -> watermark). Rows of a version
    the mapping does not name are dropped (:func:`per_version`)."""
    found, watermark = per_version(watermarks_before)
    return rows.where(found).withColumn("watermark", watermark)


def per_version(values: Mapping[int, int]) -> tuple[Column, Column]:
    """(whether ``values`` names the row's ``version``, the value it names for it).

    The mapping travels as data in the plan, not as a broadcast (a Spark job on every
    batch) nor as long literals (Spark writes those into its generated code, so every
    batch would compile again): two array literals, which the code references, hold
    each version and its value at slot ``version mod P``, P the power of two at
    least the versions' span, so a row finds its version in one step (distinct
    versions of a span no longer than P take distinct slots). P changes only when
    the span passes a power of two."""
    versions = sorted(values)
    slots = 1 << (versions[-1] - versions[0]).bit_length() if versions else 1
    slot_versions: list[int | None] = [None] * slots
    slot_values: list[int | None] = [None] * slots
    for version in versions:
        slot_versions[version % slots] = version
        slot_values[version % slots] = values[version]
    slot = (F.pmod(F.col("version"), F.lit(slots)) + 1).cast("int")
    found = F.element_at(_long_array(slot_versions), slot) == F.col("version")
    return found, F.element_at(_long_array(slot_values), slot)


def _long_array(values: Sequence[int | None]) -> Column:
    """An array<bigint> literal (folded from its JSON text: one JVM call, not one a value)."""
    return F.from_json(F.lit(json.dumps(list(values))), "array<bigint>")


def partial_key(config: PipelineConfig) -> tuple[str, ...]:
    """The columns a micro-batch's partials are grouped by, in order: the window's
    bounds in epoch milliseconds, then the pipeline's key."""
    return ("window_start_ms", "window_end_ms", *config.key)


# A partial's micro-batches are gathered as bits (a bit per micro-batch of the run, 64
# to a word, OR-ed together) rather than by collect_set: an object aggregate, which
# costs more than all the window's measures together.
VERSION_BITS_PER_WORD = 64


def window_partials(on_time: DataFrame, config: PipelineConfig, run_versions: Sequence[int]) -> DataFrame:
    """On-time pairs -> one row per (window, key) with partial aggregates and the
    sorted list of micro-batches (``versions``) that added records to it, out of the
    run's ``run_versions`` (every pair's version is one of them)."""
    ordered = sorted(run_versions)
    _, index = per_version({version: position for position, version in enumerate(ordered)})
    words = -(-len(ordered) // VERSION_BITS_PER_WORD)
    bit = _bit(index % VERSION_BITS_PER_WORD)
    masks = F.array(*(F.bit_or(F.when(_word(index) == word, bit).otherwise(0)) for word in range(words)))
    partials = on_time.groupBy(*partial_key(config)).agg(*partial_aggregates(config), masks.alias("versions"))

    def present(_: Column, position: Column) -> Column:
        word = F.element_at(F.col("versions"), (_word(position) + 1).cast("int"))
        return word.bitwiseAND(_bit(position % VERSION_BITS_PER_WORD)) != 0

    return partials.withColumn("versions", F.filter(_long_array(ordered), present))


def _word(position: Column) -> Column:
    """Which word (from 0) holds the bit of micro-batch ``position`` of the run."""
    return F.floor(position / VERSION_BITS_PER_WORD)


def _bit(position: Column) -> Column:
    """The long with only bit ``position`` (0-63) set."""
    return F.call_function("shiftleft", F.lit(1).cast("long"), position.cast("int"))


def first_firing_version(versions: Column, watermarks_after: Column) -> Column:
    """The first micro-batch of this run after which ``window_end_ms`` fires
    (watermark >= end - 1), or null; ``versions`` and ``watermarks_after`` are array
    columns in the run's order. Watermarks never go backwards, so it is the first
    position where the condition holds."""
    position = F.array_position(
        F.transform(watermarks_after, lambda w: is_fired(F.col("window_end_ms"), w)), F.lit(True)
    )
    return F.when(position > 0, F.element_at(versions, position.cast("int")))


def revision_columns(versions: Column, watermarks_after: Column) -> dict[str, Column]:
    """How a (window, key)'s revision moves in this run (DESIGN §2, as the model):
    the first firing is revision 1 and includes everything received up to it;
    each later micro-batch that adds records re-fires it (+1). ``versions`` and
    ``watermarks_after`` are the run's micro-batches and the watermark after each,
    as array columns; a partial's own micro-batches are its ``versions`` column.

    ``revision_if_new``: the window first received records in this run.
    ``revision_if_open``: it existed but had not fired yet.
    ``refires``: it had fired already; every batch with records is a re-fire."""
    fired_at = first_firing_version(versions, watermarks_after)
    batches = F.col("versions")

    def fired_then_refires(first: Column) -> Column:
        later = F.size(F.filter(batches, lambda v: v > first))
        return F.when(fired_at.isNull(), F.lit(0)).otherwise(F.lit(1) + later)

    return {
        "revision_if_new": fired_then_refires(F.greatest(fired_at, F.element_at(batches, 1))),
        "revision_if_open": fired_then_refires(fired_at),
        "refires": F.size(batches),
    }
