"""What a source reported for one bronze micro-batch: its partitions, and for each
how far bronze has consumed it and how far the source goes (pure Python, no Spark).

Bronze stores it in the userMetadata of the very commit that lands the batch's
records (``DESCRIBE HISTORY bronze.<p>`` shows it), so the report and the records
commit together and a replayed batch can never leave one without the other.
Silver, the idleness check and the Airflow page read it back to learn:

- the partitions the source knows, including those that have sent nothing yet
  (a Kafka topic's partitions; a files source's ``source.partitions``): each is
  declared to the watermark valve and holds the watermark at -inf until it sends
  data or goes idle;
- the partitions with unread input beyond what bronze consumed (Kafka lag):
  backlog, so never idle.

Offsets follow Kafka's convention: ``end`` is the next offset to read (exclusive),
``latest`` the source's log end. A files source reports partitions without
offsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from spark_jobs.config import parse_duration

METADATA_KEY = "source_partitions"
# Beside it: the partitions whose records the commit holds (silver's backlog).
WRITTEN_KEY = "partitions_written"
# How far back from bronze's latest version to look for its last report (past a
# few OPTIMIZE or maintenance commits).
REPORT_LOOKBACK = 20
# A Kafka lag whose bronze has not committed for this long is a stalled bronze
# (the idleness check's default; the Airflow page uses it as it is).
DEFAULT_STALL_AFTER = "5m"
DEFAULT_STALL_AFTER_MS = parse_duration(DEFAULT_STALL_AFTER, "--stall-after")


@dataclass(frozen=True)
class PartitionOffsets:
    end: int | None = None
    latest: int | None = None

    @property
    def lag(self) -> int:
        """Records the source holds beyond what bronze consumed (0 without offsets)."""
        if self.end is None or self.latest is None:
            return 0
        return max(self.latest - self.end, 0)

    @property
    def may_lag(self) -> bool:
        """Unread input, or a consumed offset whose source end is unknown (the broker
        did not answer): either way the partition is not known to be caught up."""
        return self.lag > 0 or (self.end is not None and self.latest is None)


@dataclass(frozen=True)
class SourceProgress:
    partitions: Mapping[str, PartitionOffsets] = field(default_factory=dict)

    @classmethod
    def declared(cls, partitions: Iterable[str]) -> SourceProgress:
        """Partitions known up front, without offsets (a files source)."""
        return cls({partition: PartitionOffsets() for partition in partitions})

    @classmethod
    def of_offsets(cls, end: Mapping[str, int], latest: Mapping[str, int]) -> SourceProgress:
        """A Kafka batch: every partition either side knows of. A partition the
        batch plan has not seen yet (added to the topic since) was consumed from 0."""
        return cls(
            {
                partition: PartitionOffsets(end.get(partition, 0), latest.get(partition))
                for partition in sorted({*end, *latest}, key=partition_order)
            }
        )

    @property
    def lagging(self) -> set[str]:
        """Partitions with unread input, or possibly: backlog, never idle."""
        return {partition for partition, offsets in self.partitions.items() if offsets.may_lag}

    def as_metadata(self) -> dict[str, object]:
        """The report as entries of a commit's userMetadata (a JSON object)."""
        if not self.partitions:
            return {}
        return {METADATA_KEY: {p: [o.end, o.latest] for p, o in self.partitions.items()}}

    @classmethod
    def from_metadata(cls, text: str | None) -> SourceProgress | None:
        """The report in a commit's userMetadata; None for a commit without one
        (table creation, OPTIMIZE, a bronze written before reports existed)."""
        if not text:
            return None
        try:
            reported = json.loads(text)[METADATA_KEY]
            return cls(
                {str(p): PartitionOffsets(end, latest) for p, (end, latest) in sorted(reported.items())}
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def partition_order(partition: str) -> tuple[int, str]:
    """Numeric partitions in numeric order (Kafka's 0, 1, ..., 10), then the rest."""
    return (0, f"{int(partition):020d}") if partition.isdigit() else (1, partition)


def known_partitions(reports: Iterable[SourceProgress]) -> set[str]:
    return {partition for report in reports for partition in report.partitions}


def lagging_partitions(reports: Iterable[SourceProgress]) -> set[str]:
    return {partition for report in reports for partition in report.lagging}


def kafka_batch_offsets(offset_log: str, topic: str) -> dict[str, int]:
    """A Kafka batch's end offsets per partition, from the batch's file in the
    stream checkpoint's ``offsets`` folder (Spark writes it before the batch runs):
    a version line, the batch metadata, then one JSON line per source."""
    for line in offset_log.splitlines()[2:]:
        try:
            offsets = json.loads(line)
        except ValueError:
            continue
        if isinstance(offsets, dict) and isinstance(offsets.get(topic), dict):
            return {str(partition): int(offset) for partition, offset in offsets[topic].items()}
    raise ValueError(f"the offset log names no offsets for Kafka topic {topic!r}")


def kafka_lag(consumed: SourceProgress, latest: Mapping[str, int]) -> dict[str, int]:
    """Per partition with unread input, how many records the topic holds now beyond
    what bronze consumed by its last batch (``consumed``)."""
    ends = {p: offsets.end for p, offsets in consumed.partitions.items() if offsets.end is not None}
    now = SourceProgress.of_offsets(ends, latest)
    return {p: offsets.lag for p, offsets in now.partitions.items() if offsets.lag > 0}


def lag_stall(
    lag: Mapping[str, int], oldest_unread_ms: Mapping[str, int], now: datetime, stall_after_ms: int
) -> str | None:
    """Why a bronze with Kafka lag is stalled, or None: stalled once a partition's
    first unread record is older than the stall limit (a young backlog is no stall,
    however long bronze has had nothing to read before it)."""
    if not oldest_unread_ms:
        return None
    oldest = min(oldest_unread_ms.values())
    if now.timestamp() * 1000 - oldest < stall_after_ms:
        return None
    partitions = ", ".join(sorted(lag, key=partition_order))
    return (
        f"bronze: Kafka lag of {sum(lag.values())} records on partitions {partitions}; the oldest "
        f"unread record reached Kafka at {datetime.fromtimestamp(oldest / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC"
    )


def written_metadata(partitions: Iterable[str]) -> dict[str, object]:
    """The partitions whose records a bronze commit holds, as userMetadata entries."""
    return {WRITTEN_KEY: sorted(partitions, key=partition_order)}


def written_partitions(text: str | None) -> frozenset[str] | None:
    """The partitions whose records a bronze commit holds, from its userMetadata;
    None for a commit that does not say (written before bronze said, or by another writer)."""
    if not text:
        return None
    try:
        written = json.loads(text)[WRITTEN_KEY]
    except (ValueError, KeyError, TypeError):
        return None
    return frozenset(map(str, written)) if isinstance(written, list) else None
