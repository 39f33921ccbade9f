"""The snapshot bridge: canonical rows move state between backends, views are point-in-time."""

from __future__ import annotations

import threading

import pytest

from state_engine.errors import IncompatibleSerializer, KeyGroupOutOfRange
from state_engine.keygroups import KeyGroupRange, assign_to_key_group
from state_engine.serde import JsonSerializer
from state_engine.state import (
    VOID_NAMESPACE,
    ListStateDescriptor,
    MapStateDescriptor,
    StateMetaInfo,
    StateTtlConfig,
    ValueStateDescriptor,
)

V = ValueStateDescriptor("v", int)
L = ListStateDescriptor("l", str)
M = MapStateDescriptor("m", str, int)
T = ValueStateDescriptor("t", str).enable_time_to_live(StateTtlConfig(10_000))
KEYS = [f"user-{i}" for i in range(200)]


def fill(b):
    v, ls, m, t = (b.get_state(d) for d in (V, L, M, T))
    for i, k in enumerate(KEYS):
        b.set_current_key(k)
        v.update(i)
        ls.add_all([f"{k}-a", f"{k}-b"])
        m.put_all({"x": i, "y": -i})
        t.update(k)
        m.set_current_namespace(i % 3)
        m.put("w", i)
        m.set_current_namespace(VOID_NAMESPACE)


def observe(b, keys=KEYS):
    v, ls, m, t = (b.get_state(d) for d in (V, L, M, T))
    out = {}
    for i, k in enumerate(keys):
        b.set_current_key(k)
        m.set_current_namespace(i % 3)
        w = m.items()
        m.set_current_namespace(VOID_NAMESPACE)
        out[k] = (v.value(), ls.get(), sorted(m.items()), t.value(), w)
    return out


@pytest.mark.parametrize("src,dst", [("heap", "rocksdb"), ("rocksdb", "heap")])
def test_export_restore_across_backends(make_backend, src, dst):
    a = make_backend(src)
    fill(a)
    with a.snapshot_view() as view:
        rows = list(view.iter_entries())
        meta = {n: m.to_dict() for n, m in view.states.items()}
    assert [r.key_group for r in rows] == sorted(r.key_group for r in rows)
    assert len(rows) == 200 * (1 + 2 + 2 + 1 + 1)
    b = make_backend(dst)
    b.restore_entries(rows, meta)
    assert set(b.registered_states()) == {"v", "l", "m", "t"}
    assert observe(b) == observe(a)
    with b.snapshot_view() as again:
        assert sorted(again.iter_entries()) == sorted(rows)


def test_restore_a_subset_of_key_groups(make_backend, backend_kind):
    a = make_backend("heap")
    fill(a)
    half = KeyGroupRange.of(0, 63)
    with a.snapshot_view() as view:
        meta = dict(view.states)
        rows = list(view.iter_entries(half))
        assert {r.key_group for r in rows} <= set(half)
        b = make_backend(backend_kind, half)
        b.restore_entries(rows, meta)
        mine = [k for k in KEYS if assign_to_key_group(k, 128) <= 63]
        assert observe(b, mine) == observe(a, mine)
        c = make_backend(backend_kind, half)
        with pytest.raises(KeyGroupOutOfRange, match="outside the range"):
            c.restore_entries(view.iter_entries(), meta)


def test_view_ignores_writes_after_it_was_taken(backend):
    fill(backend)
    view = backend.snapshot_view()
    v, ls, m = (backend.get_state(d) for d in (V, L, M))
    for k in KEYS:
        backend.set_current_key(k)
        v.update(-1)
        ls.add("later")
        m.put("x", 999)
        m.remove("y")
    backend.set_current_key("new-key")
    v.update(5)
    result: list = []
    reader = threading.Thread(target=lambda: result.extend(view.iter_entries()))
    reader.start()
    reader.join()
    view.release()
    assert len(result) == 200 * 7
    assert all(r.key != b"new-key" for r in result)
    assert not any(r.value == b"later" for r in result)
    assert sum(1 for r in result if r.user_key == b"y") == 200
    assert observe(backend)[KEYS[0]][0] == -1


@pytest.mark.parametrize("ttl", [False, True], ids=["plain", "ttl"])
@pytest.mark.parametrize("namespace", [VOID_NAMESPACE, 3], ids=["void", "namespace"])
def test_a_value_changed_in_place_after_the_view_does_not_leak_into_it(backend, ttl, namespace):
    """Read, change in place, write back (or not): the view keeps the value as it was, with or
    without TTL, in the void namespace and another (Flink copies shared state on read)."""
    doc = ValueStateDescriptor("doc", "json")
    if ttl:
        doc = doc.enable_time_to_live(StateTtlConfig(10_000))
    state = backend.get_state(doc)
    state.set_current_namespace(namespace)
    for i, k in enumerate(KEYS):
        backend.set_current_key(k)
        state.update({"n": i, "tags": ["a"]})
    view = backend.snapshot_view()
    for i, k in enumerate(KEYS):
        backend.set_current_key(k)
        value = state.value()
        value["n"] += 1000
        value["tags"].append("later")
        if i % 2:
            state.update(value)  # written back, or only changed in place
    rows = {r.key: r.value for r in view.iter_entries() if r.state == "doc"}
    view.release()
    decode = doc.serializer.deserialize
    assert {k.decode(): decode(v) for k, v in rows.items()} == {
        k: {"n": i, "tags": ["a"]} for i, k in enumerate(KEYS)
    }
    backend.set_current_key(KEYS[1])
    assert state.value() == {"n": 1001, "tags": ["a", "later"]}


def test_meta_round_trips_and_restored_serializers_are_checked(make_backend, backend_kind):
    a = make_backend(backend_kind)
    fill(a)
    meta = a.registered_states()
    assert {n: StateMetaInfo.from_dict(m.to_dict()) for n, m in meta.items()} == meta
    with a.snapshot_view() as view:
        rows = list(view.iter_entries())
    b = make_backend(backend_kind)
    b.get_state(ValueStateDescriptor("v", JsonSerializer()))
    with pytest.raises(IncompatibleSerializer, match="state 'v'"):
        b.restore_entries(rows, meta)


def test_view_ignores_writes_into_key_groups_that_were_empty(backend):
    v = backend.get_state(V)
    backend.set_current_key("a")
    v.update(1)
    view = backend.snapshot_view()
    taken = assign_to_key_group("a", 128)
    later = [k for k in (f"k{i}" for i in range(1000)) if assign_to_key_group(k, 128) != taken]
    for k in later[:50]:
        backend.set_current_key(k)
        v.update(2)
    rows = list(view.iter_entries())
    view.release()
    assert [(r.key, r.value) for r in rows if r.state == V.name] == [
        (b"a", V.serializer.serialize(1))
    ]


def test_repeated_full_views_match_fresh_rows():
    """Full heap views reuse the rows of unchanged value entries; every view still equals what a
    fresh backend with the same writes exports (in-place mutation, TTL expiry, deletes)."""
    from state_engine.backends.heap import HeapKeyedStateBackend
    from state_engine.state.ttl import CleanupStrategies, ManualClock

    J = ValueStateDescriptor("j", "json")
    TT = ValueStateDescriptor("tt", str).enable_time_to_live(
        StateTtlConfig(100, cleanup=CleanupStrategies(full_snapshot=True))
    )

    def backend(clock):
        return HeapKeyedStateBackend(str, 128, KeyGroupRange(0, 127), clock)

    clock = ManualClock(0)
    b = backend(clock)
    j, v, tt = b.get_state(J), b.get_state(V), b.get_state(TT)
    objs: dict[str, dict] = {}
    writes: list[tuple[str, str, object, int]] = []

    def apply(st, k, value):
        b.set_current_key(k)
        if value is None:
            st.clear()
        else:
            st.update(value)
        writes.append((st.name, k, value, clock.now_ms()))

    def rows(bk):
        with bk.snapshot_view() as view:
            return list(view.iter_entries())

    def replay():
        c = ManualClock(0)
        f = backend(c)
        states = {s.name: f.get_state(s) for s in (J, V, TT)}
        for name, k, value, at in writes:
            c.set(at)
            f.set_current_key(k)
            if value is None:
                states[name].clear()
            else:
                states[name].update(dict(value) if isinstance(value, dict) else value)
        c.set(clock.now_ms())
        return rows(f)

    for k in KEYS[:50]:
        objs[k] = {"n": 0}
        apply(j, k, objs[k])
        apply(v, k, 1)
        apply(tt, k, k)
    for rnd in range(4):
        assert rows(b) == replay()
        clock.advance(40)
        for i, k in enumerate(KEYS[:50]):
            if i % 3 == rnd % 3:
                objs[k]["n"] += 1  # mutated in place, stored again by update
                apply(j, k, objs[k])
                writes[-1] = (writes[-1][0], k, dict(objs[k]), clock.now_ms())
                apply(v, k, i + rnd)
                apply(tt, k, f"{k}-{rnd}")
            elif i % 7 == 0:
                apply(v, k, None)
    assert rows(b) == replay()


def _columns(rows, arrow: bool = False):
    """Rows as StateColumns, one per state, in row order; ``arrow``: each column an Arrow
    array of the canonical schema's type (as a restore from Parquet gives them)."""
    import pyarrow as pa

    from state_engine.snapshot.canonical import KEYED_SCHEMA
    from state_engine.state.meta import StateColumns

    types = [f.type for f in KEYED_SCHEMA if f.name != "state"]
    by_state: dict[str, list] = {}
    for r in rows:
        by_state.setdefault(r.state, []).append(r)
    out = []
    for name, rs in by_state.items():
        columns = [list(c) for c in zip(*((r[:4] + r[5:]) for r in rs), strict=True)]
        if arrow:
            columns = [pa.array(c, t) for c, t in zip(columns, types, strict=True)]
        out.append(StateColumns(name, *columns))
    return out


@pytest.mark.parametrize("arrow", [False, True], ids=["lists", "arrow"])
@pytest.mark.parametrize("src", ["heap", "rocksdb"])
def test_restore_columns_equals_restore_entries(make_backend, backend_kind, src, arrow):
    a = make_backend(src)
    fill(a)
    with a.snapshot_view() as view:
        rows = list(view.iter_entries())
        meta = {n: m.to_dict() for n, m in view.states.items()}
    by_entries, by_columns = make_backend(backend_kind), make_backend(backend_kind)
    by_entries.restore_entries(rows, meta)
    by_columns.restore_columns(_columns(rows, arrow), meta)
    assert observe(by_columns) == observe(by_entries) == observe(a)
    with by_columns.snapshot_view() as again:
        assert sorted(again.iter_entries()) == sorted(rows)


@pytest.mark.parametrize("arrow", [False, True], ids=["lists", "arrow"])
def test_restored_mutable_values_are_not_shared_between_keys(make_backend, arrow):
    """Equal serialized values decode once only into immutable objects: two keys restored from
    the same JSON list each get their own list."""
    J = ValueStateDescriptor("j", "json")
    a = make_backend("heap")
    j = a.get_state(J)
    for k in KEYS:
        a.set_current_key(k)
        j.update([1, 2])
    with a.snapshot_view() as view:
        rows = list(view.iter_entries())
        meta = dict(view.states)
    b = make_backend("heap")
    b.restore_columns(_columns(rows, arrow), meta)
    jb = b.get_state(J)
    b.set_current_key(KEYS[0])
    jb.value().append(3)  # in place, as a careless function might
    b.set_current_key(KEYS[1])
    assert jb.value() == [1, 2]


def test_restore_columns_refuses_foreign_key_groups_and_unknown_states(make_backend, backend_kind):
    a = make_backend("heap")
    fill(a)
    with a.snapshot_view() as view:
        rows = list(view.iter_entries())
        meta = dict(view.states)
    half = make_backend(backend_kind, KeyGroupRange.of(0, 63))
    with pytest.raises(KeyGroupOutOfRange, match="outside the range"):
        half.restore_columns(_columns(rows), meta)
    from state_engine.errors import StateError

    b = make_backend(backend_kind)
    with pytest.raises(StateError, match="not in the given state meta"):
        b.restore_columns(_columns(rows), {n: m for n, m in meta.items() if n != "m"})


@pytest.mark.parametrize("batch_rows", [1, 7, 100_000])
def test_entry_columns_hold_the_rows_of_iter_entries_in_order(
    make_backend, backend_kind, batch_rows
):
    """What a full snapshot writes column by column is exactly the row export, chunked."""
    b = make_backend(backend_kind)
    fill(b)
    tm = b.get_state(MapStateDescriptor("tm", str, int).enable_time_to_live(StateTtlConfig(10_000)))
    for i, k in enumerate(KEYS[:50]):
        b.set_current_key(k)
        tm.put_all({"p": i, "q": i + 1})
    with b.snapshot_view() as view:
        rows = list(view.iter_entries())
        chunks = list(view.entry_columns(batch_rows))
    assert all(len(c["key"]) >= min(batch_rows, len(rows)) for c in chunks[:-1])
    by_column = [row for c in chunks for row in zip(*(c[f] for f in rows[0]._fields), strict=True)]
    assert by_column == [tuple(r) for r in rows]
