# The image of every Airflow service and of the Spark master and workers in docker-compose.yml.
# Spark runs from the pyspark wheel installed here (its jars and bin/spark-class), so the
# driver, the executors and their Python workers share one Spark, one Python and one statekeeper.
FROM apache/airflow:3.3.2-python3.11

USER root
# Spark 4 needs Java 17 or 21. JAVA_HOME through a fixed link: the JVM's directory is per-arch.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/statekeeper/src /opt/airflow/secrets \
    && chown -R airflow:0 /opt/statekeeper /opt/airflow/secrets
ENV JAVA_HOME=/opt/java

USER airflow
WORKDIR /opt/statekeeper
# The wheel is built from the sources and installed like any user's install (no editable tree):
# migrations/ and plugins/ ship inside it, and the plugin also registers through its
# airflow.plugins entry point. [all]: Spark, Airflow's Spark provider, S3 and PostgreSQL. The
# sources go once the wheel is built (src/ is made above, owned by airflow: the build writes there).
COPY --chown=airflow:0 pyproject.toml setup.py README.md ./src/
COPY --chown=airflow:0 state_engine ./src/state_engine
COPY --chown=airflow:0 plugins ./src/plugins
COPY --chown=airflow:0 migrations ./src/migrations
# Airflow stays at the base image's version. requirements/overrides.txt drops pyspark-client for
# uv; pip has no overrides, so the full pyspark is reinstalled last and its files win, then checked.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/dist ./src \
    && set -- /tmp/dist/statekeeper-*.whl \
    && pip install --no-cache-dir "apache-airflow==3.3.2" "$1[all]" \
    && pip install --no-cache-dir --no-deps --force-reinstall "pyspark==4.3.0" \
    && python -c "import pyspark, os; assert pyspark.__version__ == '4.3.0', pyspark.__version__; \
assert os.path.exists(os.path.join(os.path.dirname(pyspark.__file__), 'jars', 'spark-core_2.13-4.3.0.jar'))" \
    && rm -rf ./src /tmp/dist
COPY --chown=airflow:0 docker ./docker
COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins

ENV SPARK_CONF_DIR=/opt/statekeeper/docker/spark \
    PYSPARK_PYTHON=python \
    STATEKEEPER_HOME=/opt/airflow/statekeeper
WORKDIR /opt/airflow
