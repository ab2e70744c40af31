"""Whether a lakehouse on object storage can be reached, asked once before a job
touches it: a wrong endpoint, refused credentials or a missing bucket is a clear
error within seconds, and nothing is written.

S3A retries a failed request for minutes by default (a wrong endpoint took two),
which is right for a store that stumbles mid-run and wrong for one that was never
there. The question is asked through a file system of its own, with few retries and
short timeouts; the job's own keeps S3A's patience."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_jobs.config import ConfigError
from spark_jobs.jvm import java_class
from spark_jobs.object_store import ENDPOINT_VARIABLE, is_object_store

# S3A's settings for the one question: one try, a second to connect, five to answer.
IMPATIENT = {
    "fs.s3a.attempts.maximum": "0",
    "fs.s3a.retry.limit": "0",
    "fs.s3a.retry.throttle.limit": "0",
    "fs.s3a.retry.interval": "100ms",
    "fs.s3a.connection.establish.timeout": "1s",
    "fs.s3a.connection.timeout": "5s",
    "fs.s3a.connection.request.timeout": "5s",
}

# What went wrong, by the Java class S3A reports it with (the first of a cause chain that matches).
CAUSES = (
    ("org.apache.hadoop.fs.s3a.UnknownStoreException", "the bucket does not exist"),
    (
        "java.nio.file.AccessDeniedException",
        "the store refused the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)",
    ),
    (
        "org.apache.hadoop.fs.s3a.auth.NoAuthWithAWSException",
        "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    ),
    ("java.net.ConnectException", f"nothing answers at the endpoint (${ENDPOINT_VARIABLE})"),
    ("java.net.UnknownHostException", f"the endpoint's host is unknown (${ENDPOINT_VARIABLE})"),
    ("java.net.SocketTimeoutException", f"the endpoint did not answer in time (${ENDPOINT_VARIABLE})"),
    (
        "org.apache.http.conn.ConnectTimeoutException",
        f"the endpoint did not answer in time (${ENDPOINT_VARIABLE})",
    ),
)


def require_reachable(spark: SparkSession, root: str, field: str = "--lakehouse") -> None:
    """Raise :class:`ConfigError` naming ``field`` unless ``root``'s store answers with
    its bucket and accepts the credentials (a root not yet written is fine). Paths
    other than object storage are not asked about."""
    if not is_object_store(root):
        return
    configuration = java_class(spark, "org.apache.hadoop.conf.Configuration")(
        spark._jsc.hadoopConfiguration()
    )
    for key, value in IMPATIENT.items():
        configuration.set(key, value)
    path = java_class(spark, "org.apache.hadoop.fs.Path")(root)
    file_system = None
    try:
        file_system = java_class(spark, "org.apache.hadoop.fs.FileSystem").newInstance(
            path.toUri(), configuration
        )
        file_system.exists(path)
    except Exception as error:  # py4j's error carries the Java one
        raise ConfigError(field, f"{root}: {unreachable_reason(error)}") from None
    finally:
        if file_system is not None:
            file_system.close()


def unreachable_reason(error: Exception) -> str:
    """What went wrong, in words, from the Java error behind ``error``; else its first line."""
    cause = getattr(error, "java_exception", None)
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    while cause is not None:
        name = cause.getClass().getName()
        for known, reason in CAUSES:
            if name == known:
                return reason
        first_line = f"{name}: {cause.getMessage()}"
        cause = cause.getCause()
    return first_line
