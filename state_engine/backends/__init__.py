"""State backends: heap and RocksDB keyed backends, and the operator-state backend.

Kept free of heavy imports: rocksdict loads only with ``state_engine.backends.rocksdb``.
"""
