"""The driver's handles on Java classes."""

from __future__ import annotations

from py4j.java_gateway import JavaClass
from pyspark.sql import SparkSession


def java_class(spark: SparkSession, name: str) -> JavaClass:
    """The Java class ``name`` (its binary name: ``Outer$Inner`` for a nested class).

    A dotted path through ``spark._jvm`` asks the JVM about every package on the way,
    and each is a class lookup that fails through every jar on the class path; a class
    made from its name is one lookup."""
    return JavaClass(name, spark._jvm._gateway_client)
