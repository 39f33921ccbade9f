"""The framework every maintenance job fills in, with nothing Spark in it.

Import the module you need; this package imports nothing eagerly, so the code Spark tasks run
(which imports ``ranges`` and ``source``) loads neither the catalog nor SQLAlchemy through it:

* ``run`` -- a recorded, retry-safe maintenance run and what it hands back;
* ``rewrite`` -- the run template of the jobs that rewrite a snapshot into a new one;
* ``inputs``, ``source`` -- the input snapshot: found, checked, opened, its format told;
* ``output`` -- the output snapshot around the commit protocol;
* ``ranges`` -- key-group write ranges: what a task is given and hands back;
* ``reachable`` -- which storage URLs Spark's executors reach;
* ``deletion`` -- forget-then-delete under the job's file lease;
* ``preflight`` -- the checks against the catalog before any Spark starts;
* ``job_storage`` -- where a catalog job's snapshots live;
* ``plan`` -- what the scheduled maintenance DAGs decide from the catalog;
* ``expiry`` -- the TTL rule on canonical rows;
* ``state_decode``, ``state_local`` -- ``state show``: rows decoded, read without Spark when small.

Nothing here imports pyspark, nor anything from ``jobs``, ``flink``, ``cli`` or ``runtime``.
"""
