"""Optional integrations of aiovec with other libraries.

Each submodule imports its library when it is imported itself, so ``import aiovec``
never needs them::

    from aiovec.integrations.sb3 import make_sb3_vec_env   # needs stable-baselines3
    from aiovec.integrations.torch import as_tensor         # needs torch
"""
