package io.tidemark.delta;

import org.apache.spark.sql.delta.DeltaLog;
import org.apache.spark.sql.delta.Snapshot;
import org.apache.spark.sql.delta.TruncationGranularity$;
import org.apache.spark.sql.delta.actions.Metadata;
import scala.Option;

/**
 * Delta's cleanup of a table's expired log entries, with the retention's cutoff rounded down to
 * the hour.
 *
 * <p>Delta cleans up at each checkpoint but rounds the cutoff down to midnight, so a log keeps a
 * day or more of commits whatever the table's retention, and every reader of the log lists them
 * all. Called after the commit that wrote a checkpoint, this deletes the same kind of entries
 * (those before a checkpoint older than the cutoff), counted from the hour instead.
 */
public final class HourlyLogCleanup {
  private HourlyLogCleanup() {}

  /** Whether the table was cleaned up: {@code version} is a checkpoint's and cleanup is on. */
  public static boolean afterCommit(DeltaLog log, long version) {
    Snapshot snapshot = log.unsafeVolatileSnapshot();
    Metadata metadata = snapshot.metadata();
    if (snapshot.version() != version
        || version % log.checkpointInterval(metadata) != 0
        || !log.enableExpiredLogCleanup(metadata)) {
      return false;
    }
    Option<Object> retention = Option.apply(log.deltaRetentionMillis(metadata));
    log.cleanUpExpiredLogs(snapshot, Option.empty(), retention, TruncationGranularity$.MODULE$.HOUR());
    return true;
  }
}
