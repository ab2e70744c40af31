package io.tidemark.fs;

import io.delta.storage.HDFSLogStore;
import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for {@code file:}, listing a log from a version by the names in its folder.
 *
 * <p>Delta's own ({@link HDFSLogStore}) asks the file system for the status of every entry in
 * {@code _delta_log} and then keeps those from the version asked for: a stat per commit, checksum
 * and checkpoint the table ever kept, some 16 ms per thousand entries, five to seven times a
 * micro-batch. A stream committing every second keeps a day's log (its retention), 345 k entries.
 * This store reads the folder's names, keeps those from the version asked for, and asks the status
 * of each as it is read. Writes stay Delta's: create-then-rename without overwrite.
 */
public class NamesFirstLogStore extends HDFSLogStore {
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

  public NamesFirstLogStore(Configuration hadoopConf) {
    super(hadoopConf);
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
