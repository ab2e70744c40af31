"""The engine's Spark-side parts that the jobs wire together: judging, the
pipeline clock, the window store, the watermark steps without records, the offline
detector's store and the gold store."""
