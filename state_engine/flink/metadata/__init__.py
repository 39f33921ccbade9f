"""Apache Flink's ``_metadata`` read into typed records.

One call: :func:`read_metadata` (a ``_metadata`` file or the directory holding it) returns a
:class:`FlinkSnapshotMetadata` with every handle's path resolved. :mod:`.records` holds the
records, :mod:`.parser` the binary format, :mod:`.paths` where each file is on this machine;
the directory layout and the reference roles and kinds are :mod:`state_engine.flink.layout`'s.
"""

# The package's names: its modules' (each lists them in __all__), the layout's (whose roles and
# kinds its records carry) and the one key-group range type.
from state_engine.flink.layout import *  # noqa: F403
from state_engine.flink.metadata.parser import *  # noqa: F403
from state_engine.flink.metadata.paths import *  # noqa: F403
from state_engine.flink.metadata.records import *  # noqa: F403
from state_engine.keygroups import KeyGroupRange as KeyGroupRange
