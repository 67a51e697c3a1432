"""aiovec.integrations.torch: tensors share the arrays' memory, tensor actions work, TorchVecEnv returns tensors.

Needs torch (CPU build), which the ``test`` extra must install.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
import torch
from conftest import assert_clean, wait

import aiovec
from aiovec.integrations.torch import TorchStepResult, TorchVecEnv, as_tensor, to_numpy_actions

N = 4


def test_as_tensor_shares_memory_recursively():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = as_tensor(arr)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == (3, 4)
    assert t.data_ptr() == arr.ctypes.data  # no copy
    arr[0, 0] = 42.0
    assert t[0, 0].item() == 42.0  # mutate the array, see it in the tensor
    t[1, 1] = -1.0
    assert arr[1, 1] == -1.0  # and the other way round
    nested = {"a": arr, "b": (np.zeros(3, dtype=np.uint8), np.ones(3, dtype=np.bool_)), "info": None}
    out = as_tensor(nested)
    assert out["a"].data_ptr() == arr.ctypes.data
    assert isinstance(out["b"], tuple) and out["b"][0].dtype == torch.uint8 and out["b"][1].dtype == torch.bool
    assert out["b"][0].data_ptr() == nested["b"][0].ctypes.data
    assert out["info"] is None
    ro = np.zeros(2)
    ro.flags.writeable = False  # torch cannot share a read-only array: a copy, and no warning
    assert as_tensor(ro).data_ptr() != ro.ctypes.data


def test_to_numpy_actions_recursively():
    t = torch.tensor([0, 1, 1])
    a = to_numpy_actions(t)
    assert isinstance(a, np.ndarray) and a.dtype == np.int64 and a.tolist() == [0, 1, 1]
    grad = torch.zeros(2, 3, requires_grad=True) * 2  # needs detach()
    out = to_numpy_actions({"move": grad, "fire": (torch.ones(2, dtype=torch.int64), np.zeros(2))})
    assert out["move"].shape == (2, 3) and out["move"].dtype == np.float32
    assert isinstance(out["fire"], tuple) and out["fire"][0].tolist() == [1, 1] and isinstance(out["fire"][1], np.ndarray)
    assert to_numpy_actions(None) is None


def test_tensor_actions_in_the_sync_facade(clean):
    venv = aiovec.make_vec("CartPole-v1", N, num_workers=1)
    try:
        venv.reset(seed=0)
        obs, rewards, terms, truncs, _ = venv.step(to_numpy_actions(torch.ones(N, dtype=torch.int64)))
        t = as_tensor(obs)
        assert t.shape == (N, 4) and t.dtype == torch.float32 and t.data_ptr() == obs.ctypes.data
        assert as_tensor(rewards).dtype == torch.float64 and as_tensor(terms).dtype == torch.bool
    finally:
        venv.close()
    assert_clean(clean)


def test_torch_vec_env_reset_step_send_recv(run_uv, clean):
    async def main():
        ref = aiovec.make("CartPole-v1", N, num_workers=1)
        async with TorchVecEnv(aiovec.make("CartPole-v1", N, num_workers=2)) as venv, ref:
            assert venv.num_envs == N and venv.single_action_space.n == 2  # the rest is the wrapped env's
            obs, infos = await wait(venv.reset(seed=3))
            ref_obs, _ = await wait(ref.reset(seed=3))
            assert isinstance(obs, torch.Tensor) and obs.shape == (N, 4) and obs.dtype == torch.float32
            np.testing.assert_array_equal(obs.numpy(), ref_obs)
            actions = torch.tensor([0, 1, 0, 1])
            obs, rewards, terms, truncs, infos = await wait(venv.step(actions))
            ref_out = await wait(ref.step(actions.numpy()))
            assert obs.shape == (N, 4) and obs.dtype == torch.float32
            assert rewards.shape == (N,) and rewards.dtype == torch.float32
            assert terms.dtype == truncs.dtype == torch.bool and terms.shape == truncs.shape == (N,)
            np.testing.assert_array_equal(obs.numpy(), ref_out[0])
            np.testing.assert_array_equal(rewards.numpy(), ref_out[1].astype(np.float32))
            venv.send(torch.ones(N, dtype=torch.int64))
            r = await wait(venv.recv(2))
            assert isinstance(r, TorchStepResult) and r.obs.shape == (2, 4)
            assert r.env_ids.dtype == torch.int64 and r.env_ids.shape == (2,)
            venv.send(torch.zeros(2, dtype=torch.int64), r.env_ids)  # tensor env ids work too
            rest = await wait(venv.drain())
            assert sum(len(x.env_ids) for x in rest) == N
            with pytest.raises(aiovec.InvalidActionError):
                await venv.step(torch.zeros(N, dtype=torch.float32))  # float actions for a Discrete space
        assert venv.closed

    run_uv(main())
    assert_clean(clean)


def test_reward_dtype_option(run_uv, clean):
    async def main():
        async with TorchVecEnv(aiovec.make("CartPole-v1", 2, num_workers=1), reward_dtype=torch.float64) as venv:
            await venv.reset(seed=0)
            _, rewards, *_ = await venv.step(torch.zeros(2, dtype=torch.int64))
            assert rewards.dtype == torch.float64

    run_uv(main())
    assert_clean(clean)


def test_clear_import_error_without_torch(monkeypatch):
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: "import it" raises ImportError
    monkeypatch.delitem(sys.modules, "aiovec.integrations.torch")
    with pytest.raises(ImportError, match=r"pip install 'aiovec\[torch\]'"):
        importlib.import_module("aiovec.integrations.torch")


def test_torch_vec_env_refuses_the_sync_facade_with_a_hint(clean):
    envs = aiovec.make_vec("CartPole-v1", 2, num_workers=1)
    try:
        with pytest.raises(aiovec.ConfigError, match="aiovec.make"):
            TorchVecEnv(envs)
    finally:
        envs.close()
    assert_clean(clean)
