package io.tidemark.fs;

import io.delta.storage.HDFSLogStore;
import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for {@code file:}: a version committed by one writer of any number of JVMs,
 * and a log listed from a version by the names in its folder.
 *
 * <p>Delta's own store checks that a version's file is absent and then renames its temporary file
 * onto it, and only a lock inside one JVM keeps two commits of that version apart: a rename
 * replaces its target, so of two JVMs committing one version at the same moment, the later one
 * silently overwrites the earlier's commit. This store writes the version's temporary file, syncs
 * it to disk, and links it to the version's name (link(2) fails if the name exists, atomically):
 * the JVM that loses the race gets the {@link FileAlreadyExistsException} Delta expects, and Delta
 * checks for conflicts and retries at the next version. A commit is whole on disk before it is
 * visible, so a machine that stops mid-commit leaves no truncated version.
 *
 * <p>Delta's own ({@link HDFSLogStore}) asks the file system for the status of every entry in
 * {@code _delta_log} and then keeps those from the version asked for: a stat per commit, checksum
 * and checkpoint the table ever kept, some 16 ms per thousand entries, five to seven times a
 * micro-batch: a day of a commit a second is 345 k entries. This store reads the folder's names,
 * keeps those from the version asked for, and asks the status of each as it is read.
 */
public class LocalLogStore extends HDFSLogStore {
  // What the listings of this JVM have cost, for tests that pin a batch's cost against history.
  private static final AtomicLong LISTINGS = new AtomicLong();
  private static final AtomicLong STATUSES = new AtomicLong();

  public static long listings() {
    return LISTINGS.get();
  }

  /** The entries whose status listings have asked for, over all listings of this JVM. */
  public static long statuses() {
    return STATUSES.get();
  }

  public LocalLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fileSystem = path.getFileSystem(hadoopConf);
    if (overwrite || !(fileSystem instanceof LocalFileSystem)) {
      super.write(path, actions, overwrite, hadoopConf);
      return;
    }
    java.nio.file.Path target = ((LocalFileSystem) fileSystem).pathToFile(path).toPath();
    java.nio.file.Path temporary =
        target.resolveSibling("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
    try {
      try (FileChannel channel =
          FileChannel.open(temporary, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
        while (actions.hasNext()) {
          ByteBuffer line = ByteBuffer.wrap((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
          while (line.hasRemaining()) {
            channel.write(line);
          }
        }
        channel.force(true);
      }
      Files.createLink(target, temporary);
      // The new name on disk too: a version a writer saw committed stays committed.
      try (FileChannel folder = FileChannel.open(target.getParent(), StandardOpenOption.READ)) {
        folder.force(true);
      }
    } catch (FileAlreadyExistsException taken) {
      throw new FileAlreadyExistsException(path.toString());
    } finally {
      Files.deleteIfExists(temporary);
    }
  }

  @Override
  public Iterator<FileStatus> listFrom(Path path, Configuration hadoopConf) throws IOException {
    FileSystem fileSystem = path.getFileSystem(hadoopConf);
    if (!(fileSystem instanceof LocalFileSystem)) {
      return super.listFrom(path, hadoopConf);
    }
    LISTINGS.incrementAndGet();
    Path folder = path.getParent();
    String[] names = ((LocalFileSystem) fileSystem).pathToFile(folder).list();
    if (names == null) {
      throw new FileNotFoundException("No such file or directory: " + folder);
    }
    String first = path.getName();
    List<String> kept = new ArrayList<>();
    for (String name : names) {
      if (name.compareTo(first) >= 0) {
        kept.add(name);
      }
    }
    kept.sort(null);
    return new Statuses(fileSystem, folder, kept.iterator());
  }

  /**
   * The entries' statuses, each asked for when the reader gets to it: Delta's cleanup reads the
   * log from its first entry and stops at the first one past the retention.
   */
  private static final class Statuses implements Iterator<FileStatus> {
    private final FileSystem fileSystem;
    private final Path folder;
    private final Iterator<String> names;
    private FileStatus next;

    Statuses(FileSystem fileSystem, Path folder, Iterator<String> names) {
      this.fileSystem = fileSystem;
      this.folder = folder;
      this.names = names;
    }

    @Override
    public boolean hasNext() {
      while (next == null && names.hasNext()) {
        Path entry = new Path(folder, names.next());
        if (((LocalFileSystem) fileSystem).isChecksumFile(entry)) {
          continue;
        }
        STATUSES.incrementAndGet();
        try {
          next = fileSystem.getFileStatus(entry);
        } catch (FileNotFoundException deletedSinceListed) {
          // Log cleanup removed it after the listing, as it could have before.
        } catch (IOException failed) {
          throw new UncheckedIOException(failed);
        }
      }
      return next != null;
    }

    @Override
    public FileStatus next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      FileStatus found = next;
      next = null;
      return found;
    }
  }
}
