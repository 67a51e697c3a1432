"""A short soak: stepping under injected worker deaths loses, duplicates and misattributes nothing."""

from __future__ import annotations

from conftest import assert_clean, snapshot

import aiovec
from aiovec.bench.soak import soak


def test_short_soak_with_injected_crashes() -> None:
    before = snapshot()
    r = aiovec.run(soak(15.0, num_envs=6, num_workers=3, fault_rate=1e-3))
    assert r["faults_survived"] >= 3, r
    assert r["transitions_sent"] == r["transitions_received"] > 1000, r
    assert r["lost"] == r["duplicated"] == r["misattributed"] == r["out_of_sequence"] == 0, r
    assert r["hangs"] == 0 and r["leaked_processes"] == 0, r
    assert_clean(before)
