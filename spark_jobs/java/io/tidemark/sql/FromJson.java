package io.tidemark.sql;

import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Map;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.catalyst.CatalystTypeConverters;
import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JsonToStructs;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Function1;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Spark's {@code from_json} as a function of compiled code: the same expression, evaluated for
 * the rows that reach it.
 *
 * <p>Spark evaluates {@code from_json} interpreted only ({@code CodegenFallback}), and a
 * projection holding such an expression is left out of whole-stage code generation: it copies
 * every column of every row into a row of its own, whether or not a row evaluates the parse.
 * Bronze reads a line a second time only when the fast path does not take it (a {@code CASE
 * WHEN}), so a user-defined function, which compiled code calls, keeps the projection compiled
 * and costs the conversions to and from Spark's external types only on the rows that parse.
 */
public final class FromJson implements UDF1<String, Object> {
  private static final long serialVersionUID = 1L;
  private static final ObjectMapper JSON = new ObjectMapper();
  private final JsonToStructs parse;
  private transient Function1<Object, Object> external;

  private FromJson(JsonToStructs parse) {
    this.parse = parse;
  }

  @Override
  public Object call(String text) {
    if (text == null) {
      return null;
    }
    Object value = parse.eval(new GenericInternalRow(new Object[] {UTF8String.fromString(text)}));
    if (external == null) {
      external = CatalystTypeConverters.createToScalaConverter(parse.dataType());
    }
    return external.apply(value);
  }

  /**
   * {@code from_json(text, schema, options)}: {@code schema} as a data type's JSON, {@code
   * options} as a JSON object of strings, {@code zone} the session's time zone.
   */
  public static Column of(Column text, String schema, String options, String zone) {
    Map<String, String> read;
    try {
      read = JSON.readValue(options, new TypeReference<Map<String, String>>() {});
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    JsonToStructs parse =
        new JsonToStructs(
            DataType.fromJson(schema),
            scala.collection.immutable.Map.from(CollectionConverters.asScala(read)),
            new BoundReference(0, DataTypes.StringType, true),
            Option.apply(zone),
            JsonToStructs.$lessinit$greater$default$5());
    return functions.udf(new FromJson(parse), parse.dataType()).apply(text);
  }
}
