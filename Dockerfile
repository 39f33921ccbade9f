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
    && mkdir -p /opt/statekeeper /opt/airflow/secrets \
    && chown -R airflow:0 /opt/statekeeper /opt/airflow/secrets
ENV JAVA_HOME=/opt/java

USER airflow
WORKDIR /opt/statekeeper
COPY --chown=airflow:0 pyproject.toml README.md alembic.ini ./
COPY --chown=airflow:0 requirements ./requirements
COPY --chown=airflow:0 migrations ./migrations
COPY --chown=airflow:0 state_engine ./state_engine
# Editable, so the catalog finds migrations/ next to state_engine/ (see catalog/migrate.py).
# Airflow stays at the base image's version. requirements/overrides.txt drops pyspark-client for
# uv; pip has no overrides, so the full pyspark is reinstalled last and its files win, then checked.
RUN pip install --no-cache-dir "apache-airflow==3.3.2" -e ".[s3]" \
    && pip install --no-cache-dir --no-deps --force-reinstall "pyspark==4.3.0" \
    && python -c "import pyspark, os; assert pyspark.__version__ == '4.3.0', pyspark.__version__; \
assert os.path.exists(os.path.join(os.path.dirname(pyspark.__file__), 'jars', 'spark-core_2.13-4.3.0.jar'))"
COPY --chown=airflow:0 docker ./docker
COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins

ENV SPARK_CONF_DIR=/opt/statekeeper/docker/spark \
    PYSPARK_PYTHON=python \
    STATEKEEPER_HOME=/opt/airflow/statekeeper
WORKDIR /opt/airflow
