"""Handles on Java classes."""

from types import SimpleNamespace
from unittest.mock import MagicMock

from spark_jobs.jvm import java_class


def test_a_class_made_from_its_name_asks_the_jvm_nothing():
    # A dotted path through spark._jvm asks the JVM about every package on the way.
    client = MagicMock()
    spark = SimpleNamespace(_jvm=SimpleNamespace(_gateway_client=client))

    made = java_class(spark, "org.apache.spark.sql.delta.DeltaOperations$Write")

    assert made._fqn == "org.apache.spark.sql.delta.DeltaOperations$Write"
    client.send_command.assert_not_called()
