package io.tidemark.delta;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * The newest commit file of a Delta table's log, found and read in one call from Python: every
 * job looks at each table's before it starts, a log keeps an hour of commits, and a Py4J call per
 * listed file would cost seconds.
 */
public final class LogFiles {
  private static final Pattern COMMIT = Pattern.compile("[0-9]{20}\\.json");

  private LogFiles() {}

  /**
   * For each of {@code tables} (one path per line) with a commit file, a record: the table, a
   * newline, its highest version with a commit file, a newline, then that file's text as it is on
   * disk (past any checksum: what a crash left of it). Records end with a NUL character.
   */
  public static String newestCommits(Configuration configuration, String tables)
      throws IOException {
    StringBuilder records = new StringBuilder();
    for (String table : tables.split("\n")) {
      Path log = new Path(table, "_delta_log");
      String newest = newestCommit(log.getFileSystem(configuration), log);
      if (newest != null) {
        records.append(table).append('\n').append(newest).append('\0');
      }
    }
    return records.toString();
  }

  private static String newestCommit(FileSystem fileSystem, Path log) throws IOException {
    // On a local disk the names alone, without a status per file: Hadoop's local file
    // system stats every entry of a listing, a few milliseconds for an hour of commits.
    boolean local = "file".equals(fileSystem.getUri().getScheme());
    String[] names = local ? new File(log.toUri().getPath()).list() : namesIn(fileSystem, log);
    if (names == null) {
      return null;
    }
    long newest = -1;
    for (String name : names) {
      if (COMMIT.matcher(name).matches()) {
        newest = Math.max(newest, Long.parseLong(name.substring(0, 20)));
      }
    }
    if (newest < 0) {
      return null;
    }
    Path commit = new Path(log, String.format("%020d.json", newest));
    if (local) {
      return newest + "\n" + Files.readString(Paths.get(commit.toUri().getPath()), StandardCharsets.UTF_8);
    }
    FileSystem raw =
        fileSystem instanceof ChecksumFileSystem
            ? ((ChecksumFileSystem) fileSystem).getRawFileSystem()
            : fileSystem;
    try (InputStream in = raw.open(commit)) {
      return newest + "\n" + new String(in.readAllBytes(), StandardCharsets.UTF_8);
    }
  }

  private static String[] namesIn(FileSystem fileSystem, Path log) throws IOException {
    if (!fileSystem.exists(log)) {
      return null;
    }
    FileStatus[] statuses = fileSystem.listStatus(log);
    String[] names = new String[statuses.length];
    for (int index = 0; index < statuses.length; index++) {
      names[index] = statuses[index].getPath().getName();
    }
    return names;
  }
}
