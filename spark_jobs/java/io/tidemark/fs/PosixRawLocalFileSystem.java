package io.tidemark.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system, with the two calls it makes through a shell done by the JVM.
 *
 * <p>Without Hadoop's native library (pip's pyspark has none) {@link RawLocalFileSystem} runs
 * {@code readlink} for every link status, which every rename asks for its source and its
 * destination (and their checksum files), and {@code chmod} for every file it creates. A Delta
 * commit or a streaming checkpoint file therefore started 5 processes.
 */
public class PosixRawLocalFileSystem extends RawLocalFileSystem {
  @Override
  public FileStatus getFileLinkStatus(Path path) throws IOException {
    // A link's status (its target, qualified) stays Hadoop's; anything else is its own status.
    if (Files.isSymbolicLink(pathToFile(path).toPath())) {
      return super.getFileLinkStatus(path);
    }
    return getFileStatus(path);
  }

  @Override
  public void setPermission(Path path, FsPermission permission) throws IOException {
    // Java's POSIX permissions have no sticky bit.
    if (permission.getStickyBit()) {
      super.setPermission(path, permission);
      return;
    }
    Files.setPosixFilePermissions(
        pathToFile(path).toPath(), PosixFilePermissions.fromString(permission.toString()));
  }
}
