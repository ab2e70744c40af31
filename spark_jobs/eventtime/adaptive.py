"""A watermark generator that adapts its out-of-orderness bound to the disorder it
observes (DESIGN §2b): the bound follows a high quantile of how far each batch's
records fall behind their partition's newest event time, clamped between a floor
and a ceiling.

Seed 002 ends on the trade-off a fixed bound forces: too tight loses records as
late, too loose delays every result. This one grows the bound at once when a batch
shows more disorder than it allows (fewer records are lost), and shrinks it by half
the difference per batch when the disorder subsides (windows fire sooner again).

    watermark:
      strategy: custom
      generator: "spark_jobs.eventtime.adaptive:AdaptiveBound"
      options: {quantile: 0.99, floor: 2s, ceiling: 2m}
"""

from __future__ import annotations

from typing import Any

from spark_jobs.config import ConfigError, parse_duration
from spark_jobs.eventtime.generators import DISORDER_QUANTILES, BatchSummary, GeneratorError


class AdaptiveBound:
    """Bounded out-of-orderness with a bound that follows the ``quantile`` of the
    observed disorder, kept within [``floor``, ``ceiling``]; it starts at
    ``initial`` (the ceiling unless given), so nothing is lost before any disorder
    is seen. The watermark is the partition's newest event time - bound - 1 ms."""

    def __init__(
        self, quantile: float = 0.99, floor: str = "1s", ceiling: str = "5m", initial: str | None = None
    ) -> None:
        # ``True == 1``: a boolean is no quantile, whatever the set holds.
        if isinstance(quantile, bool) or quantile not in DISORDER_QUANTILES:
            problem = f"AdaptiveBound: quantile must be one of {DISORDER_QUANTILES}; got {quantile!r}"
            raise GeneratorError(problem, "options")
        self.quantile = quantile
        self.floor_ms = _duration(floor, "floor")
        self.ceiling_ms = _duration(ceiling, "ceiling")
        if self.floor_ms > self.ceiling_ms:
            raise GeneratorError(f"AdaptiveBound: floor {floor} exceeds ceiling {ceiling}", "options")
        start = self.ceiling_ms if initial is None else _duration(initial, "initial")
        self.bound_ms = self._clamped(start)

    def on_batch(self, batch: BatchSummary) -> int | None:
        observed = batch.disorder.get(self.quantile)
        if observed is not None:
            if observed >= self.bound_ms:
                self.bound_ms = self._clamped(observed)
            else:
                self.bound_ms = self._clamped(self.bound_ms - (self.bound_ms - observed) // 2)
        newest = max((t for t in (batch.running_max, batch.max_timestamp) if t is not None), default=None)
        return None if newest is None else newest - self.bound_ms - 1

    def snapshot(self) -> dict[str, Any]:
        return {"bound_ms": self.bound_ms}

    def restore(self, state: dict[str, Any]) -> None:
        self.bound_ms = int(state["bound_ms"])

    def _clamped(self, bound_ms: int) -> int:
        return min(max(bound_ms, self.floor_ms), self.ceiling_ms)


def _duration(value: Any, option: str) -> int:
    try:
        return parse_duration(value, option)
    except ConfigError as error:
        raise GeneratorError(f"AdaptiveBound: {error}", "options") from None
