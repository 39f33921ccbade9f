"""The RocksDB keyed state backend: its key layout, state classes, factory, native snapshots and
their restore.

Importing it loads rocksdict; ``snapshot`` and ``restore`` (which need the checkpoint formats and
pyarrow) load on the first native snapshot or restore.
"""

from state_engine.backends.rocksdb.backend import (
    RocksAggregatingState,
    RocksDBKeyedStateBackend,
    RocksDBStateView,
    RocksListState,
    RocksMapState,
    RocksReducingState,
    RocksValueState,
)
from state_engine.backends.rocksdb.factory import RocksDBBackendFactory
from state_engine.backends.rocksdb.layout import decode_list, encode_list

__all__ = [
    "RocksAggregatingState",
    "RocksDBBackendFactory",
    "RocksDBKeyedStateBackend",
    "RocksDBStateView",
    "RocksListState",
    "RocksMapState",
    "RocksReducingState",
    "RocksValueState",
    "decode_list",
    "encode_list",
]
