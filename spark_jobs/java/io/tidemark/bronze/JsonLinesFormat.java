package io.tidemark.bronze;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.Arrays;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.Job;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.json.CreateJacksonParser;
import org.apache.spark.sql.catalyst.json.JSONOptions;
import org.apache.spark.sql.catalyst.json.JacksonParser;
import org.apache.spark.sql.catalyst.util.FailureSafeParser;
import org.apache.spark.sql.catalyst.util.PermissiveMode$;
import org.apache.spark.sql.execution.datasources.FileFormat;
import org.apache.spark.sql.execution.datasources.OutputWriterFactory;
import org.apache.spark.sql.execution.datasources.PartitionedFile;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.SerializableConfiguration;
import org.apache.spark.util.TaskCompletionListener;
import scala.Option;
import scala.collection.AbstractIterator;
import scala.collection.Iterable;
import scala.collection.Iterator;
import scala.collection.immutable.Map;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction1;
import scala.runtime.AbstractFunction2;

/**
 * A JSON-lines file as bronze reads it: one row a line, in one pass over the file's bytes.
 *
 * <p>Columns (any subset, in any order, as the reader's schema names them): {@code raw}, the
 * line without its line end; {@code source_offset}, its 1-based line number; {@code one_object},
 * the byte scan's verdict that the line, if it parses as an object, is that object and nothing
 * else (it begins with {@code {} and its only {@code }} is its last byte:
 * {@code spark_jobs.transforms.parse.surely_one_object} states the same rule for a record that
 * arrives alone); {@code typed}, a struct: the line read by Spark's {@code from_json} at that
 * struct's types, PERMISSIVE, a line that does not parse flagged in its {@code _corrupt_record}.
 *
 * <p>Why not Spark's own sources: the text source gives no line numbers unless a file is read
 * whole and split in Spark, and {@code from_json} decodes every value through a character reader;
 * the JSON source skips blank lines and gives no raw text. Here a line that is valid UTF-8 and
 * begins with {@code {} is handed to Jackson as bytes (as the JSON source does, but as a stream:
 * {@link JacksonOpen}); any other goes through {@code from_json}'s own character reader, so every
 * line gets {@code from_json}'s answer.
 * A trailing newline ends the last line; it does not start an empty one. A file is read a buffer at
 * a time, so a landing file may be larger than a task's memory.
 */
public final class JsonLinesFormat implements FileFormat, Serializable {
  private static final long serialVersionUID = 1L;
  static final String CORRUPT = "_corrupt_record";

  @Override
  public Option<StructType> inferSchema(SparkSession spark, Map<String, String> options, Seq<FileStatus> files) {
    return Option.empty(); // the reader names its columns
  }

  @Override
  public OutputWriterFactory prepareWrite(
      SparkSession spark, Job job, Map<String, String> options, StructType schema) {
    throw new UnsupportedOperationException("Tidemark's JSON-lines format is read-only");
  }

  @Override
  public scala.Function1<PartitionedFile, Iterator<InternalRow>> buildReader(
      SparkSession spark,
      StructType dataSchema,
      StructType partitionSchema,
      StructType requiredSchema,
      Seq<Filter> filters,
      Map<String, String> options,
      Configuration hadoopConf) {
    return new FileReader(
        requiredSchema,
        spark.sessionState().conf().sessionLocalTimeZone(),
        new SerializableConfiguration(hadoopConf));
  }

  @Override
  public String toString() {
    return "TidemarkJsonLines";
  }

  /** Opens a file and hands out its lines. */
  static final class FileReader extends AbstractFunction1<PartitionedFile, Iterator<InternalRow>>
      implements Serializable {
    private static final long serialVersionUID = 1L;
    private final StructType schema;
    private final String zone;
    private final SerializableConfiguration conf;

    FileReader(StructType schema, String zone, SerializableConfiguration conf) {
      this.schema = schema;
      this.zone = zone;
      this.conf = conf;
    }

    @Override
    public Iterator<InternalRow> apply(PartitionedFile file) {
      Path path = file.toPath();
      try {
        InputStream in = path.getFileSystem(conf.value()).open(path);
        TaskContext task = TaskContext.get();
        if (task != null) {
          task.addTaskCompletionListener((TaskCompletionListener) context -> closeQuietly(in));
        }
        return new Lines(in, schema, zone);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
  }

  static void closeQuietly(InputStream in) {
    try {
      in.close();
    } catch (IOException e) {
      // the file was read to its end, or its task failed already
    }
  }

  /**
   * A file's lines, read a buffer at a time: a whole landing file in one array (megabytes) is a
   * humongous object to G1, and each one started a concurrent marking cycle beside the tasks.
   */
  static final class Lines extends AbstractIterator<InternalRow> {
    private static final int BUFFER = 64 * 1024;
    private final InputStream in;
    private byte[] bytes = new byte[BUFFER];
    private int start = 0; // the unread bytes are bytes[start, filled)
    private int filled = 0;
    private boolean ended = false;
    private final int raw;
    private final int offset;
    private final int oneObject;
    private final int typed;
    private final GenericInternalRow row;
    private final JacksonOpen open = new JacksonOpen();
    private final FailureSafeParser<UTF8String> parser;
    private long line = 0;

    Lines(InputStream in, StructType schema, String zone) {
      this.in = in;
      this.raw = index(schema, "raw");
      this.offset = index(schema, "source_offset");
      this.oneObject = index(schema, "one_object");
      this.typed = index(schema, "typed");
      this.row = new GenericInternalRow(schema.length());
      this.parser = typed < 0 ? null : fromJson((StructType) schema.fields()[typed].dataType(), zone, open);
    }

    private static int index(StructType schema, String name) {
      StructField[] fields = schema.fields();
      for (int i = 0; i < fields.length; i++) {
        if (fields[i].name().equals(name)) {
          return i;
        }
      }
      return -1;
    }

    /** Reads more of the file behind the unread bytes; false at its end. */
    private boolean more() {
      if (ended) {
        return false;
      }
      if (start > 0) {
        System.arraycopy(bytes, start, bytes, 0, filled - start);
        filled -= start;
        start = 0;
      }
      if (filled == bytes.length) {
        bytes = Arrays.copyOf(bytes, bytes.length * 2); // a line longer than the buffer
      }
      try {
        int read = in.read(bytes, filled, bytes.length - filled);
        if (read < 0) {
          ended = true;
          in.close();
          return false;
        }
        filled += read;
        return true;
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    // A trailing newline ends the last line: no bytes after it, no line.
    @Override
    public boolean hasNext() {
      return start < filled || more();
    }

    @Override
    public InternalRow next() {
      int stop = start;
      int closing = 0;
      int highBits = 0; // negative once a byte is not ASCII
      while (true) {
        while (stop < filled && bytes[stop] != '\n') {
          closing += bytes[stop] == '}' ? 1 : 0;
          highBits |= bytes[stop];
          stop++;
        }
        if (stop < filled) {
          break;
        }
        int scanned = stop - start;
        boolean read = more();
        stop = start + scanned; // more() moves the unread bytes to the buffer's start
        if (!read) {
          break; // the last line, with no newline after it
        }
      }
      int length = stop > start && bytes[stop - 1] == '\r' ? stop - start - 1 : stop - start;
      // A view of the buffer: the scan's projection copies it into the row before the next line.
      UTF8String text = UTF8String.fromBytes(bytes, start, length);
      int first = start;
      start = Math.min(stop + 1, filled);
      line++;
      if (raw >= 0) {
        row.update(raw, text);
      }
      if (offset >= 0) {
        row.setLong(offset, line);
      }
      if (oneObject >= 0) {
        row.setBoolean(
            oneObject, length > 0 && bytes[first] == '{' && bytes[first + length - 1] == '}' && closing == 1);
      }
      if (typed >= 0) {
        open.ascii = highBits >= 0;
        Iterator<InternalRow> read = parser.parse(text);
        row.update(typed, read.hasNext() ? read.next() : null);
      }
      return row;
    }
  }

  /** {@code from_json(line, schema, {mode: PERMISSIVE})} as Spark's JsonToStructs builds it. */
  static FailureSafeParser<UTF8String> fromJson(StructType schema, String zone, JacksonOpen open) {
    @SuppressWarnings("unchecked")
    Map<String, String> options =
        (Map<String, String>)
            (Object)
                scala.collection.immutable.Map$.MODULE$
                    .<String, String>empty()
                    .updated("mode", "PERMISSIVE")
                    .updated("columnNameOfCorruptRecord", CORRUPT);
    JSONOptions json = new JSONOptions(options, zone, CORRUPT);
    StructType fields =
        new StructType(
            Arrays.stream(schema.fields()).filter(f -> !f.name().equals(CORRUPT)).toArray(StructField[]::new));
    @SuppressWarnings("unchecked")
    Seq<Filter> noFilters = (Seq<Filter>) (Object) scala.collection.immutable.Nil$.MODULE$;
    JacksonParser jackson = new JacksonParser(fields, json, false, noFilters);
    AbstractFunction1<UTF8String, UTF8String> itself =
        new AbstractFunction1<>() {
          @Override
          public UTF8String apply(UTF8String text) {
            return text;
          }
        };
    AbstractFunction1<UTF8String, Iterable<InternalRow>> parse =
        new AbstractFunction1<>() {
          @Override
          public Iterable<InternalRow> apply(UTF8String text) {
            return jackson.parse(text, open, itself);
          }
        };
    return new FailureSafeParser<>(parse, PermissiveMode$.MODULE$, schema, CORRUPT);
  }

  /**
   * Jackson over a line's bytes where that reads what {@code from_json}'s character reader reads:
   * valid UTF-8 (the reader would replace a bad byte with U+FFFD) beginning with {@code {} (the
   * byte parser takes a leading byte-order mark or zero bytes for an encoding's signature). The
   * bytes come as a stream, not as an array: given an array, Spark's parser cuts a string field's
   * text out of it by Jackson's offsets (which count from the line, not from the array: another
   * line's bytes), where from a stream, as from a reader, it writes the field's value out again.
   */
  static final class JacksonOpen extends AbstractFunction2<JsonFactory, UTF8String, JsonParser> {
    /** The reader's scan found the next line all ASCII, so valid UTF-8 without a second scan. */
    boolean ascii = false;

    @Override
    public JsonParser apply(JsonFactory factory, UTF8String text) {
      if (text.numBytes() > 0 && text.getByte(0) == '{' && (ascii || text.isValid())) {
        ByteBuffer buffer = text.getByteBuffer();
        try {
          return factory.createParser(
              new ByteArrayInputStream(
                  buffer.array(), buffer.arrayOffset() + buffer.position(), buffer.remaining()));
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      }
      return CreateJacksonParser.utf8String(factory, text);
    }
  }
}
