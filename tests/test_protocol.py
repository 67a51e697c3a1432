"""The worker-to-parent step frames built without pickle, and infos packed as records.

Records must batch into exactly what gymnasium's ``_add_info`` builds (keys, masks,
dtypes); anything they cannot carry exactly must travel as the dicts the envs returned.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_tree_equal, batch_reference_infos

from aiovec import protocol as P
from aiovec.infos import batch_infos


def test_records_reply_sends_each_schema_once_and_decodes_to_the_same_infos() -> None:
    infos = [{"x": np.float64(i), "r": np.float32(-i), "lives": 3, "ok": True} for i in range(4)]
    packed = P.pack_infos(infos)
    assert type(packed) is P.InfoRecords
    sent: dict = {}
    first = P.records_reply(P.Timing(1.0, 2.0, 3.0), packed, sent)
    second = P.records_reply(P.Timing(4.0, 5.0, 0.0), packed, sent)
    assert len(second) < len(first)  # the schema travelled with the first frame only
    seen: dict = {}
    timing, got = P.decode_records(first, seen)
    assert timing == P.Timing(1.0, 2.0, 3.0)
    reply = P.decode_reply(second, seen)
    assert reply.op == P.STEP and reply.timing == P.Timing(4.0, 5.0, 0.0)
    for decoded in (got, reply.payload):
        assert decoded.as_dicts() == infos
        assert [type(v) for v in decoded.as_dicts()[0].values()] == [np.float64, np.float32, int, bool]


def test_a_full_schema_record_falls_back_to_pickled_replies() -> None:
    sent = {("k", i): i for i in range(P.MAX_SCHEMAS)}
    assert P.records_reply(P.Timing(0.0, 0.0), P.pack_infos([{"new": 1.0}]), sent) is None


@pytest.mark.parametrize("infos", [
    [{"a": 1.0}, {"a": 1}],  # one key, two value types
    [{"a": 1.0}, {"b": 1.0}],  # keys differ
    [{"a": 1.0}, None],  # an env without an info
    [{"a": np.bool_(True)}, {"a": np.bool_(False)}],  # gymnasium batches numpy.bool_ as objects
    [{"a": np.zeros(2)}, {"a": np.zeros(2)}],  # arrays
    [{"a": {"b": 1.0}}, {"a": {"b": 1.0}}],  # nested
    [{1: 1.0}, {1: 2.0}],  # a key that cannot name a record field
])
def test_what_records_cannot_carry_exactly_travels_as_dicts(infos: list) -> None:
    assert P.pack_infos(infos) is infos


@pytest.mark.parametrize("split", [[4], [2, 2], [1, 3]])
def test_records_batch_like_gymnasium_whole_and_in_parts(split: list[int]) -> None:
    infos = [{"x": float(i), "n": i, "f": np.float32(i / 2), "b": i % 2 == 0} for i in range(4)]
    parts, start = [], 0
    for size in split:
        parts.append((np.arange(start, start + size), P.pack_infos(infos[start : start + size]), None))
        start += size
    assert_tree_equal(batch_infos(4, [], parts), batch_reference_infos(infos), "records")


def test_records_for_some_rows_leave_the_others_masked_out() -> None:
    infos = [{"x": float(i)} for i in range(3)]
    block = P.pack_infos(infos)
    selected = np.array([True, False, True])
    got = batch_infos(5, [], [(np.array([4, 0]), block, selected)])
    want: list[dict] = [{}] * 5
    want[4], want[0] = infos[0], infos[2]
    assert_tree_equal(got, batch_reference_infos(want), "partial records")


def test_records_mixed_with_dict_infos_batch_like_gymnasium() -> None:
    block = P.pack_infos([{"x": 1.0}, {"x": 2.0}])
    got = batch_infos(3, [(1, {"worker_restarted": True})], [(np.array([0, 2]), block, None)])
    want = batch_reference_infos([{"x": 1.0}, {"worker_restarted": True}, {"x": 2.0}])
    assert_tree_equal(got, want, "mixed infos")
