"""Canonical columns built from NumPy buffers equal ``pa.array``'s, and a checkpoint never imports
pandas (``pa.array`` on a Python list does, costing seconds on the checkpoint thread)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine.snapshot.canonical import (
    _from_buffers,
    binary_lengths,
    int_values,
    is_valid,
)

REPO = Path(__file__).resolve().parents[2]


@settings(deadline=None)  # the first pa.array imports pandas
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=60))
def test_binary_columns_equal_pa_array(values: list[bytes | None]) -> None:
    arr = _from_buffers(values, pa.binary())
    assert arr is not None
    arr.validate(full=True)
    assert arr.equals(pa.array(values, type=pa.binary()))
    assert binary_lengths(arr).tolist() == [len(v or b"") for v in values]
    assert is_valid(arr).tolist() == [v is not None for v in values]
    if len(values) > 2:  # a slice keeps its offset into the buffers
        s = arr.slice(1)
        assert binary_lengths(s).tolist() == [len(v or b"") for v in values[1:]]
        assert is_valid(s).tolist() == [v is not None for v in values[1:]]


@settings(deadline=None)  # the first pa.array imports pandas
@given(st.lists(st.one_of(st.none(), st.text(max_size=12)), max_size=60))
def test_string_columns_equal_pa_array(values: list[str | None]) -> None:
    arr = _from_buffers(values, pa.string())
    assert arr is not None
    arr.validate(full=True)
    assert arr.equals(pa.array(values, type=pa.string()))


@pytest.mark.parametrize(("type_", "bits"), [(pa.int8(), 8), (pa.int32(), 32), (pa.int64(), 64)])
@settings(deadline=None)  # the first pa.array imports pandas
@given(data=st.data())
def test_int_columns_equal_pa_array(type_: pa.DataType, bits: int, data: Any) -> None:
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    values = data.draw(st.lists(st.one_of(st.none(), st.integers(lo, hi)), max_size=60))
    arr = _from_buffers(values, type_)
    assert arr is not None
    arr.validate(full=True)
    assert arr.equals(pa.array(values, type=type_))
    assert int_values(arr).tolist() == [v or 0 for v in values]
    if len(values) > 2:
        assert int_values(arr.slice(2)).tolist() == [v or 0 for v in values[2:]]


@pytest.mark.parametrize(
    ("values", "type_"),
    [
        ([2**31], pa.int32()),  # out of range: pa.array refuses it with its own message
        ([2**63], pa.int64()),
        (["1"], pa.int32()),
        ([True], pa.int32()),
        ([1.5], pa.int64()),
        (["s"], pa.binary()),
        ([b"s"], pa.string()),
        (["\ud800"], pa.string()),  # a lone surrogate cannot be UTF-8
        ([1], pa.float64()),
    ],
)
def test_anything_unusual_is_left_to_pa_array(values: list[Any], type_: pa.DataType) -> None:
    assert _from_buffers(values, type_) is None


def test_int_values_of_chunked_arrays() -> None:
    chunked = pa.chunked_array([pa.array([1, None], pa.int32()), pa.array([3], pa.int32())])
    assert int_values(chunked).tolist() == [1, 0, 3]
    assert int_values(chunked).dtype == np.int32


def test_checkpoints_and_restores_do_not_import_pandas(tmp_path: Path) -> None:
    # a fresh interpreter: this test process may have imported pandas already
    script = textwrap.dedent(
        f"""
        import sys
        from state_engine.catalog import Catalog, upgrade
        from state_engine.checkpoint import HeapBackendFactory
        from state_engine.examples import fraud
        from state_engine.runtime import JobRunner

        url = "sqlite:///{tmp_path / "catalog.db"}"
        upgrade(url)
        for fmt in ("canonical", "delta"):
            catalog = Catalog.open(url)
            job = fraud.build_job(
                2, HeapBackendFactory(track_changes=fmt == "delta"), checkpoint_every=1_000,
                format=fmt, incremental=fmt == "delta", name="j-" + fmt,
                records_per_partition=1_000,
            )
            with JobRunner(job, catalog=catalog, storage="{tmp_path.as_uri()}/chk") as r:
                result = r.run()
            assert len(result.checkpoints) >= 4, result
            catalog.close()
        assert "pandas" not in sys.modules, "a checkpoint imported pandas"
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
