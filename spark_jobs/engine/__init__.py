"""The engine's Spark-side parts that the jobs wire together: judging, the
pipeline clock, the window store and the watermark steps without records."""
