package io.tidemark.fs;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for object storage ({@code s3a:}): a version committed by one writer of any
 * number of drivers, through the store's put-if-absent.
 *
 * <p>Delta's own store for S3 checks that a version is absent and then puts it, and only a lock
 * inside one driver keeps two commits of that version apart. This store creates the version's
 * object with Hadoop's conditional create ({@code fs.option.create.conditional.overwrite}: S3A
 * sends {@code If-None-Match: *}), so the store itself refuses the second put of a name: the driver
 * that loses the race gets the {@link FileAlreadyExistsException} Delta expects, and Delta checks
 * for conflicts and retries at the next version. A put is whole or absent, so no reader ever sees
 * half a commit.
 *
 * <p>A store that ignored the condition would let the later of two writers replace the earlier's
 * commit without a word. Before its first commit to a bucket, a JVM therefore puts a probe object
 * twice under the condition and refuses to commit there unless the store refused the second put.
 */
public class ObjectStoreLogStore extends HadoopFileSystemLogStore {
  static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";
  // Buckets (scheme and authority) whose store was seen to refuse a second conditional put.
  private static final Map<String, Boolean> HONOURS_CONDITION = new ConcurrentHashMap<>();

  public ObjectStoreLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fileSystem = path.getFileSystem(hadoopConf);
    byte[] content = joined(actions);
    if (overwrite) {
      try (FSDataOutputStream out = fileSystem.create(path, true)) {
        out.write(content);
      }
      return;
    }
    requireConditionalCreate(fileSystem, path);
    if (!createIfAbsent(fileSystem, path, content)) {
      throw new FileAlreadyExistsException(path.toString());
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false;
  }

  /**
   * Put {@code content} at {@code path} unless an object is there; false when one was. A refused
   * put counts as a lost race only once the name is seen taken: AWS also refuses a conditional put
   * that meets another in flight (409), and then neither may have landed.
   */
  static boolean createIfAbsent(FileSystem fileSystem, Path path, byte[] content) throws IOException {
    // The condition alone decides, in the put itself: overwrite(false) would first ask
    // for the name's status, a round trip that settles nothing (both writers can be
    // told it is free). The builder's raw type erases what build() returns.
    try (FSDataOutputStream out =
        (FSDataOutputStream)
            fileSystem.createFile(path).overwrite(true).must(CONDITIONAL_CREATE, true).build()) {
      out.write(content);
    } catch (org.apache.hadoop.fs.FileAlreadyExistsException seenBeforeThePut) {
      return false;
    } catch (IOException failed) {
      if (refusedByCondition(failed) && fileSystem.exists(path)) {
        return false;
      }
      throw failed;
    }
    return true;
  }

  /**
   * S3A reports the store's refusal of a conditional put as a {@code RemoteFileChangedException}
   * (hadoop-aws, which this class does not compile against) when the stream closes.
   */
  static boolean refusedByCondition(Throwable failure) {
    for (Throwable cause = failure; cause != null; cause = cause.getCause()) {
      if (cause.getClass().getName().equals("org.apache.hadoop.fs.s3a.RemoteFileChangedException")) {
        return true;
      }
    }
    return false;
  }

  private static void requireConditionalCreate(FileSystem fileSystem, Path path) throws IOException {
    String bucket = fileSystem.getUri().getScheme() + "://" + fileSystem.getUri().getAuthority();
    if (HONOURS_CONDITION.containsKey(bucket)) {
      return;
    }
    Path probe = new Path(path.getParent(), ".tidemark-conditional-put-" + UUID.randomUUID());
    byte[] marker = new byte[] {'1'};
    try {
      boolean first = createIfAbsent(fileSystem, probe, marker);
      boolean second = createIfAbsent(fileSystem, probe, marker);
      if (!first || second) {
        throw new IOException(
            "the object store at "
                + bucket
                + " does not refuse a second put of one name under If-None-Match: two writers"
                + " of a table could overwrite each other's commits there; Tidemark commits only"
                + " to a store with conditional writes (S3, SeaweedFS, MinIO, s3proxy 4+)");
      }
    } finally {
      fileSystem.delete(probe, false);
    }
    HONOURS_CONDITION.put(bucket, true);
  }

  private static byte[] joined(Iterator<String> actions) {
    StringBuilder text = new StringBuilder();
    while (actions.hasNext()) {
      text.append(actions.next()).append('\n');
    }
    return text.toString().getBytes(StandardCharsets.UTF_8);
  }
}
