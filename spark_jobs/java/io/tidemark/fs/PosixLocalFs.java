package io.tidemark.fs;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * {@code fs.AbstractFileSystem.file.impl}, the {@code FileContext} side (Delta's commits and
 * Spark's checkpoint files rename through it): Hadoop's {@code LocalFs} over {@link
 * PosixRawLocalFileSystem}. Hadoop's {@code RawLocalFs} cannot be given another file system, so
 * {@link Raw} repeats what it adds to {@link DelegateToFileSystem}.
 */
public class PosixLocalFs extends ChecksumFs {
  public PosixLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    // As Hadoop's LocalFs: the local file system's URI, whichever file: URI asked.
    super(new Raw(conf));
  }

  static final class Raw extends DelegateToFileSystem {
    Raw(Configuration conf) throws IOException, URISyntaxException {
      super(
          FsConstants.LOCAL_FS_URI,
          new PosixRawLocalFileSystem(),
          conf,
          FsConstants.LOCAL_FS_URI.getScheme(),
          false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;
    }

    @Override
    public FsServerDefaults getServerDefaults(Path path) throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    @Deprecated
    public FsServerDefaults getServerDefaults() throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public boolean isValidName(String src) {
      return true;
    }
  }
}
