package io.tidemark.fs;

import org.apache.hadoop.fs.LocalFileSystem;

/** {@code fs.file.impl}: Hadoop's checksummed local file system over {@link PosixRawLocalFileSystem}. */
public class PosixLocalFileSystem extends LocalFileSystem {
  public PosixLocalFileSystem() {
    super(new PosixRawLocalFileSystem());
  }
}
