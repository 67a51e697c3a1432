"""A short soak: stepping under injected worker deaths loses, duplicates and misattributes nothing."""

from __future__ import annotations

import time

import pytest
from conftest import assert_clean, snapshot

import aiovec
from aiovec.bench.soak import soak

pytestmark = pytest.mark.slow

MIN_FAULTS, MIN_TRANSITIONS, DEADLINE_S = 3, 1000, 240.0


def test_short_soak_with_injected_crashes() -> None:
    """Soak rounds until at least 3 workers died and 1000 transitions went through, however long that takes.

    Every round must account for every transition; only the deadline (a hang guard) is in wall time.
    """
    before = snapshot()
    faults = transitions = rounds = 0
    end = time.monotonic() + DEADLINE_S
    while faults < MIN_FAULTS or transitions < MIN_TRANSITIONS:
        assert time.monotonic() < end, f"{rounds} soak rounds in {DEADLINE_S}s: only {faults} faults, {transitions} transitions"
        r = aiovec.run(soak(5.0, num_envs=6, num_workers=3, fault_rate=1e-3))
        rounds += 1
        assert r["transitions_sent"] == r["transitions_received"], r
        assert r["lost"] == r["duplicated"] == r["misattributed"] == r["out_of_sequence"] == 0, r
        assert r["hangs"] == 0 and r["leaked_processes"] == 0, r
        faults += r["faults_survived"]
        transitions += r["transitions_received"]
    assert_clean(before)
