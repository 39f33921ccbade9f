#!/usr/bin/env bash
# Adds Hadoop's S3A file system (hadoop-aws and the AWS SDK bundle it needs) to the Spark that
# ships inside the pyspark wheel. The version is read from that Spark's own hadoop-client jar, so
# the two always match; Ivy (through spark itself) resolves the SDK bundle for that version.
set -euo pipefail

spark_home=$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
hadoop=$(ls "$spark_home/jars" | sed -n 's/^hadoop-client-api-\(.*\)\.jar$/\1/p')
test -n "$hadoop" || { echo "no hadoop-client-api jar in $spark_home/jars" >&2; exit 1; }
ivy=$(mktemp -d)
python - "$hadoop" "$ivy" <<'PY'
import sys
from pyspark.sql import SparkSession
hadoop, ivy = sys.argv[1], sys.argv[2]
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.jars.packages", f"org.apache.hadoop:hadoop-aws:{hadoop}")
    .config("spark.jars.ivy", ivy)
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
spark.stop()
PY
for jar in "$ivy"/jars/*.jar; do
  # keep Spark's own copy of anything it already ships
  name=$(basename "$jar" | sed 's/^[^_]*_//')
  ls "$spark_home/jars/$name" >/dev/null 2>&1 || cp "$jar" "$spark_home/jars/$name"
done
rm -rf "$ivy"
ls "$spark_home/jars" | grep -q '^hadoop-aws-' || { echo "hadoop-aws was not added" >&2; exit 1; }
