"""The catalog API's response models say what the catalog's records say, field by field.

The pydantic ``*Out`` models of ``statekeeper_airflow.schemas`` repeat the frozen dataclasses of
``state_engine.catalog.records`` for OpenAPI. A field added to, renamed in, dropped from or
retyped in a record fails here until the model follows it or the table below says why not.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
import typing
from typing import Any

import pytest
from pydantic import BaseModel
from statekeeper_airflow import schemas

from state_engine.catalog import records

#: model -> (its record, the record's fields the API leaves out, the fields only the API has)
PAIRS: dict[type[BaseModel], tuple[type, set[str], set[str]]] = {
    schemas.SnapshotOut: (records.SnapshotRecord, {"writer", "details"}, set()),
    schemas.JobOut: (records.JobRecord, {"origin"}, {"latest_snapshot"}),
    schemas.SnapshotFileOut: (records.SnapshotFileRecord, {"snapshot_id", "details"}, set()),
    schemas.SkewOut: (records.SkewRecord, {"snapshot_id"}, {"estimated"}),
    schemas.FilesSummary: (records.FilesSummary, set(), set()),
    schemas.SizePointOut: (records.SizePoint, set(), set()),
    schemas.RunOut: (records.RunRecord, set(), set()),
}


def _normal(t: Any) -> Any:
    """A type as it travels in JSON: a str enum as str, unions as sets of their members."""
    if isinstance(t, type) and issubclass(t, enum.Enum) and issubclass(t, str):
        return str
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        return ("union", frozenset(_normal(a) for a in typing.get_args(t)))
    if origin is not None:
        return (origin, tuple(_normal(a) for a in typing.get_args(t)))
    return t


def test_every_record_model_of_the_api_is_checked() -> None:
    models = {
        cls
        for _, cls in inspect.getmembers(schemas, inspect.isclass)
        if issubclass(cls, schemas.Record) and cls is not schemas.Record
    }
    assert models == set(PAIRS)


@pytest.mark.parametrize("model", list(PAIRS), ids=lambda m: m.__name__)
def test_a_model_has_its_records_fields_in_order_with_their_types(
    model: type[BaseModel],
) -> None:
    record, left_out, only_api = PAIRS[model]
    record_types = typing.get_type_hints(record)
    record_fields = [f.name for f in dataclasses.fields(record)]
    model_fields = list(model.model_fields)
    assert left_out <= set(record_fields), f"{model.__name__} leaves out fields {record} lacks"
    assert only_api <= set(model_fields) and not only_api & set(record_fields)
    shared = [f for f in record_fields if f not in left_out]
    assert [f for f in model_fields if f not in only_api] == shared
    for name in shared:
        want, have = _normal(record_types[name]), _normal(model.model_fields[name].annotation)
        assert have == want, f"{model.__name__}.{name} is {have}, {record.__name__} has {want}"
