"""Watermark bounds shared by every event-time rule.

Watermarks are epoch milliseconds held in a signed 64-bit integer, like Flink's
``Watermark`` and Spark's ``bigint``. Before any data a clock stands at
``MIN_WATERMARK`` (Flink's ``Long.MIN_VALUE``); end of input moves it to
``MAX_WATERMARK`` (``Long.MAX_VALUE``), which fires every window and timer.
"""

MIN_WATERMARK = -(2**63)
MAX_WATERMARK = 2**63 - 1
