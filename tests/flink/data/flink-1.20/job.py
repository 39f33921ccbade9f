"""The PyFlink job that wrote this directory's snapshots (not run by the tests).

Run with apache-flink==1.20.5 (Java 17): ``python job.py rocksdb|hashmap OUT``. Keyed state per
card ``card-000``..``card-039`` (``i % 40``) of the amounts ``i % 997``, for the indexes
``[0, 200000]`` (split 1) and ``[200001, 400000]`` (split 2) of a NumberSequenceSource:
``total`` (LONG value: their sum), ``merchants`` (STRING -> LONG map: a count per ``m{amount % 7}``)
and ``recent`` (LONG list: the amounts divisible by 50). Incremental checkpoints every second (3
retained), then a canonical and a native savepoint, then cancel.
"""

import sys
import time

from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from pyflink.java_gateway import get_gateway

backend, out = sys.argv[1], sys.argv[2]
conf = Configuration()
conf.set_string("state.backend.type", backend)
conf.set_string("state.backend.incremental", "true")
conf.set_string("state.checkpoints.dir", "file://" + out + "/checkpoints")
conf.set_string("state.savepoints.dir", "file://" + out + "/savepoints")
conf.set_string("execution.checkpointing.interval", "1 s")
conf.set_string(
    "execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION"
)
conf.set_string("state.checkpoints.num-retained", "3")
conf.set_string("pipeline.max-parallelism", "128")
conf.set_string("python.executable", sys.executable)
conf.set_string("python.client.executable", sys.executable)
env = StreamExecutionEnvironment.get_execution_environment(conf)
env.set_parallelism(2)


class Agg(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext):
        self.total = ctx.get_state(ValueStateDescriptor("total", Types.LONG()))
        self.merchants = ctx.get_map_state(
            MapStateDescriptor("merchants", Types.STRING(), Types.LONG())
        )
        self.recent = ctx.get_list_state(ListStateDescriptor("recent", Types.LONG()))

    def process_element(self, value, ctx):
        card, amount = value
        self.total.update((self.total.value() or 0) + amount)
        m = f"m{amount % 7}"
        self.merchants.put(m, (self.merchants.get(m) or 0) + 1)
        if amount % 50 == 0:
            self.recent.add(amount)
        yield card, amount


pair = Types.TUPLE([Types.STRING(), Types.LONG()])
ds = env.from_source(NumberSequenceSource(0, 400000), WatermarkStrategy.no_watermarks(), "seq")
ds = ds.map(lambda i: (f"card-{i % 40:03d}", i % 997), output_type=pair).uid("mapper")
ds.key_by(lambda x: x[0], key_type=Types.STRING()).process(Agg(), output_type=pair).uid(
    "agg"
).print()
client = env.execute_async(f"flink-1.20-{backend}")
while "RUNNING" not in str(client.get_job_status().result()):
    time.sleep(0.5)
time.sleep(6)  # a few checkpoints
fmt = get_gateway().jvm.org.apache.flink.core.execution.SavepointFormatType


def savepoint(kind, fmt_type):
    for _ in range(120):  # tasks start a while after the job is RUNNING (Python workers)
        try:
            return client._j_job_client.triggerSavepoint(
                out + "/savepoints-" + kind, fmt_type
            ).get()
        except Exception as exc:  # not all tasks are running yet
            print("retry", str(exc)[:80], flush=True)
            time.sleep(1)
    return None


print("SAVEPOINT", savepoint("canonical", fmt.CANONICAL), flush=True)
print("SAVEPOINT", savepoint("native", fmt.NATIVE), flush=True)
time.sleep(3)
client.cancel().result()
print("DONE", flush=True)
