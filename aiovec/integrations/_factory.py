"""Env factories that worker processes unpickle: this module imports nothing heavy (no SB3, no torch)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym


def make_wrapped(spec: Any, kwargs: dict[str, Any], wrapper_class: Any, wrapper_kwargs: dict[str, Any]) -> gym.Env:
    """``wrapper_class(gymnasium.make(spec, **kwargs), **wrapper_kwargs)`` (no wrapper when it is None).

    Example: ``functools.partial(make_wrapped, gymnasium.spec("CartPole-v1"), {}, None, {})`` is an env factory.
    """
    env = gym.make(spec, **kwargs)
    if wrapper_class is not None:
        env = wrapper_class(env, **wrapper_kwargs)
    return env
