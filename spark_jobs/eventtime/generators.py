"""Per-partition watermark generators (DESIGN §2, §2b; seeds 000-002).

A generator sees every record of its partition, on time or late, and is asked
for its watermark once per micro-batch (Flink's periodic emission with the
trigger interval as the period). Watermarks never go backwards.

Besides the built-in strategies, a pipeline may name its own generator class
(``strategy: custom``), Flink's ``WatermarkStrategy.forGenerator``: one instance per
source partition, given a :class:`BatchSummary` of each micro-batch in which its
partition sent records, returning the partition's watermark candidate. The rules
around it stay Tidemark's: never backwards, idleness, the valve.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK

STRATEGIES = ("bounded", "monotonous", "punctuated", "custom")

# The disorder quantiles a custom generator is given, in thousandths (exact integer
# ranks, the same in Spark and in Python): the median, p90, p99 and the largest.
DISORDER_PERMILLE = (500, 900, 990, 1000)
DISORDER_QUANTILES = tuple(permille / 1000 for permille in DISORDER_PERMILLE)


def disorder_rank(permille: int, count: int) -> int:
    """The 1-based rank, in ascending order of lag, of a batch's ``permille``
    quantile lag among ``count`` records: the smallest rank whose share of the
    records (rank / count) reaches the quantile, as SQL's ``percentile_disc``."""
    return max(1, -(-permille * count // 1000))


def quantile_timestamps(timestamps: Sequence[int]) -> tuple[int, ...]:
    """Per :data:`DISORDER_PERMILLE`, the data timestamp at that quantile of lag
    behind a running maximum: lag ascends as the timestamp descends, so it is the
    ``disorder_rank``-th largest timestamp. Empty without timestamps."""
    newest_first = sorted(timestamps, reverse=True)
    if not newest_first:
        return ()
    return tuple(newest_first[disorder_rank(p, len(newest_first)) - 1] for p in DISORDER_PERMILLE)


@dataclass(frozen=True)
class PartitionInput:
    """What one partition sent in one batch: its largest data timestamp and its
    largest marker watermark (either may be absent). A custom generator is also
    told the number of data records, the smallest timestamp and the timestamps at
    the disorder quantiles (:func:`quantile_timestamps`);
    the engine computes those only for a custom generator."""

    max_timestamp: int | None = None
    max_marker: int | None = None
    rows: int = 0
    min_timestamp: int | None = None
    quantile_timestamps: tuple[int, ...] = ()


@dataclass(frozen=True)
class BatchSummary:
    """What a custom generator is told about its partition in one micro-batch.

    ``rows``: the batch's data records of the partition (markers not counted), on
    time or late; ``max_timestamp``/``min_timestamp``: their largest and smallest
    event times; ``max_marker``: the largest punctuation marker (with
    ``marker_column``); ``running_max``: the partition's largest event time before
    this batch (None before its first data); ``disorder``: per quantile (0.5, 0.9,
    0.99, 1.0), how many milliseconds the batch's records fall behind
    ``running_max`` (0 for a record at or beyond it). A record is late for a
    bounded watermark exactly when its lag exceeds the bound. Empty before the
    partition's first data and in a batch with markers only."""

    rows: int
    max_timestamp: int | None
    min_timestamp: int | None
    max_marker: int | None
    running_max: int | None
    disorder: Mapping[float, int] = field(default_factory=dict)


class WatermarkGenerator(Protocol):
    """A user's generator, one instance per source partition. ``on_batch`` returns
    the partition's watermark candidate (epoch ms) or None to keep the last one.

    A generator that keeps state across batches also defines ``snapshot()``,
    returning JSON-able data, and ``restore(state)``: Tidemark records the snapshot
    with the partition's clock, so a restart or a replay after a crash continues
    exactly where the last committed batch left it."""

    def on_batch(self, batch: BatchSummary) -> int | None: ...


class GeneratorError(ValueError):
    """A custom generator is missing, has the wrong shape, or misbehaved; ``field``
    names the pipeline file's culprit (``generator`` or ``options``)."""

    def __init__(self, problem: str, culprit: str = "generator") -> None:
        super().__init__(problem)
        self.field = culprit


def import_generator(reference: str, search_folder: str | None = None) -> Callable[..., Any]:
    """The class named ``package.module:Class``, imported with ``search_folder``
    (the pipeline file's folder) first on the path, so a module beside the pipeline
    file is found."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute or not all(part.isidentifier() for part in module_name.split(".")):
        raise GeneratorError(f"expected 'package.module:Class'; got {reference!r}")
    beside = None if search_folder is None else Path(search_folder, f"{module_name}.py")
    added = search_folder is not None and search_folder not in sys.path
    if added:
        sys.path.insert(0, search_folder)
    try:
        if beside is not None and beside.is_file():
            module = _module_at(beside)
        else:
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise GeneratorError(f"cannot import {module_name!r}: {error}") from None
    except Exception as error:  # the module's own code failed: a user's bug, told as such
        raise GeneratorError(f"importing {module_name!r} failed: {type(error).__name__}: {error}") from None
    finally:
        if added:
            sys.path.remove(search_folder)
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise GeneratorError(f"module {module_name!r} has no {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise GeneratorError(f"{reference!r} is not a class or a factory")
    return found


def _module_at(path: Path) -> Any:
    """The module in the file ``path``, loaded once under a name of its own: two
    pipeline folders may each keep a ``generators.py``, and neither shadows the other."""
    name = f"_tidemark_generator_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def check_generator(instance: Any, reference: str) -> None:
    """The shape Tidemark calls: ``on_batch(summary)``, and ``snapshot``/``restore`` both or neither."""
    on_batch = getattr(instance, "on_batch", None)
    if not callable(on_batch):
        raise GeneratorError(f"{reference} has no on_batch(batch) method")
    try:
        inspect.signature(on_batch).bind(None)
    except TypeError:
        raise GeneratorError(f"{reference}.on_batch must take one argument (the batch summary)") from None
    except ValueError:  # a builtin without a signature: trust it
        pass
    stateful = [callable(getattr(instance, name, None)) for name in ("snapshot", "restore")]
    if any(stateful) and not all(stateful):
        raise GeneratorError(f"{reference} must define both snapshot() and restore(state), or neither")


@dataclass(frozen=True)
class WatermarkSpec:
    """How each source partition derives its watermark, and when it counts as idle.

    ``max_out_of_orderness_ms`` only matters for ``bounded`` (``monotonous`` is
    bounded with 0). ``idleness_ms`` of ``None`` disables idle detection.
    """

    strategy: str = "bounded"
    max_out_of_orderness_ms: int = 0
    idleness_ms: int | None = None
    marker_column: str | None = None
    # ``custom`` only: the class (``package.module:Class``), the keyword arguments each
    # partition's instance is built with, and the folder searched first for its module.
    generator: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    search_folder: str | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown watermark strategy {self.strategy!r}")
        if self.max_out_of_orderness_ms < 0:
            raise ValueError("max_out_of_orderness_ms must not be negative")
        if (self.strategy == "custom") != (self.generator is not None):
            raise ValueError("a generator class goes with the custom strategy, and only with it")

    @property
    def needs_disorder(self) -> bool:
        """Whether the generators are told more than the maxima (a custom one is)."""
        return self.strategy == "custom"

    @cached_property
    def generator_factory(self) -> Callable[..., Any]:
        return import_generator(str(self.generator), self.search_folder)

    def new_generator(self) -> Any:
        """One partition's instance of the custom generator, checked for its shape."""
        try:
            instance = self.generator_factory(**self.options)
        except GeneratorError:
            raise
        except Exception as error:
            problem = (
                f"{self.generator} refused its options {dict(self.options)}: {type(error).__name__}: {error}"
            )
            raise GeneratorError(problem, "options") from None
        check_generator(instance, str(self.generator))
        return instance

    @property
    def bound_ms(self) -> int:
        return self.max_out_of_orderness_ms if self.strategy == "bounded" else 0

    def watermark_for_max_timestamp(self, max_timestamp: int | None) -> int:
        """Flink's BoundedOutOfOrdernessWatermarks: ``max_ts - bound - 1``."""
        if max_timestamp is None:
            return MIN_WATERMARK
        return max_timestamp - self.bound_ms - 1


class PartitionGenerator:
    """Watermark generator of one source partition.

    ``bounded``/``monotonous`` track the largest timestamp seen; ``punctuated``
    takes the watermark carried by marker records (seed 002's
    MyPunctuatedGenerator) and ignores data timestamps; ``custom`` asks the user's
    generator, with the largest timestamp kept here as for ``bounded``.
    """

    def __init__(self, spec: WatermarkSpec) -> None:
        self.spec = spec
        self.max_timestamp: int | None = None
        self._watermark = MIN_WATERMARK
        self.custom = spec.new_generator() if spec.strategy == "custom" else None
        # A custom generator has state to record once it has seen a batch (or was
        # restored from one): a partition that never sent records records none, so a
        # restart leaves every partition's clock as an uninterrupted run has it.
        self._has_state = False

    @classmethod
    def restored(
        cls,
        spec: WatermarkSpec,
        max_timestamp: int | None,
        watermark: int,
        generator_state: str | None = None,
    ) -> PartitionGenerator:
        """A generator as it stood when its state was saved (:attr:`generator_state`).
        State another generator class wrote is not its own: it starts afresh."""
        generator = cls(spec)
        generator.max_timestamp = max_timestamp
        generator._watermark = watermark
        saved = json.loads(generator_state) if generator_state is not None else None
        if (
            isinstance(saved, dict)
            and saved.get("generator") == spec.generator
            and generator.custom is not None
        ):
            if hasattr(generator.custom, "restore"):
                try:
                    generator.custom.restore(saved["state"])
                except Exception as error:
                    failure = f"{type(error).__name__}: {error}"
                    problem = f"{spec.generator}.restore failed on {saved['state']!r}: {failure}"
                    raise GeneratorError(problem) from error
            generator._has_state = True
        return generator

    @property
    def generator_state(self) -> str | None:
        """A custom generator's ``snapshot()`` with the class that wrote it, as JSON
        text; None without a stateful custom generator, or before its partition's first
        batch. The snapshot must come back from JSON as it went in (no tuples, no number keys)."""
        if not hasattr(self.custom, "snapshot") or not self._has_state:
            return None
        state = self.custom.snapshot()
        try:
            text = json.dumps(
                {"generator": self.spec.generator, "state": state}, sort_keys=True, allow_nan=False
            )
        except (TypeError, ValueError) as error:
            problem = f"{self.spec.generator}.snapshot() returned no JSON-able data: {error}"
            raise GeneratorError(problem) from None
        if json.loads(text)["state"] != state:
            problem = (
                f"{self.spec.generator}.snapshot() returned {state!r}, which JSON does not give back as it is"
            )
            raise GeneratorError(problem)
        return text

    def advance(self, sent: PartitionInput) -> int:
        """Take what the partition sent in one batch, and emit."""
        if self.custom is not None:
            return self._ask_custom(sent)
        if sent.max_timestamp is not None:
            self.on_event(sent.max_timestamp)
        if sent.max_marker is not None:
            self.on_marker(sent.max_marker)
        return self.emit()

    def _ask_custom(self, sent: PartitionInput) -> int:
        running_max = self.max_timestamp
        summary = BatchSummary(
            rows=sent.rows,
            max_timestamp=sent.max_timestamp,
            min_timestamp=sent.min_timestamp,
            max_marker=sent.max_marker,
            running_max=running_max,
            disorder=disorder_behind(running_max, sent.quantile_timestamps),
        )
        self._has_state = True
        try:
            candidate = self.custom.on_batch(summary)
        except Exception as error:
            problem = f"{self.spec.generator}.on_batch failed: {type(error).__name__}: {error}"
            raise GeneratorError(problem) from error
        if sent.max_timestamp is not None:
            self.on_event(sent.max_timestamp)
        if candidate is None:
            return self._watermark
        if isinstance(candidate, bool) or not isinstance(candidate, int):
            raise GeneratorError(
                f"{self.spec.generator}.on_batch returned {candidate!r}; "
                "expected a watermark in epoch milliseconds, or None"
            )
        # +inf is the end of input's alone (a flush): a candidate is capped below it.
        self._watermark = max(self._watermark, min(candidate, MAX_WATERMARK - 1))
        return self._watermark

    def on_event(self, timestamp: int) -> None:
        if self.spec.strategy == "punctuated":
            return
        if self.max_timestamp is None or timestamp > self.max_timestamp:
            self.max_timestamp = timestamp

    def on_marker(self, watermark: int) -> None:
        if self.spec.strategy == "punctuated":
            self._watermark = max(self._watermark, watermark)

    def emit(self) -> int:
        """The watermark at the end of the current period (never decreasing)."""
        if self.spec.strategy != "punctuated":
            candidate = self.spec.watermark_for_max_timestamp(self.max_timestamp)
            self._watermark = max(self._watermark, candidate)
        return self._watermark


def disorder_behind(running_max: int | None, quantile_timestamps: Sequence[int]) -> dict[float, int]:
    """Per disorder quantile, how far the batch's records fall behind ``running_max``
    (never below 0), from the timestamps at those quantiles (see
    :func:`quantile_timestamps`). Empty without an earlier maximum or without data."""
    if running_max is None or not quantile_timestamps:
        return {}
    return {
        quantile: max(0, running_max - timestamp)
        for quantile, timestamp in zip(DISORDER_QUANTILES, quantile_timestamps, strict=True)
    }
