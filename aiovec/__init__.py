"""aiovec: an asyncio-native orchestrator for gymnasium environments in worker processes."""

from . import envs as _envs  # registers the aiovec/* synthetic envs
from .controller import AdaptiveController, Controller, Decision, Measurement, StaticController
from .errors import (
    AiovecError,
    ClosedError,
    ConfigError,
    EnvAttributeError,
    EnvError,
    EnvStateError,
    InvalidActionError,
    StepTimeoutError,
    WorkerCrashedError,
)
from .gym import VectorEnv, make_vec
from .loop import run
from .make import make
from .measured import MeasuredController
from .vecenv import AsyncVecEnv, StepResult

__all__ = [
    "AdaptiveController",
    "AiovecError",
    "Controller",
    "Decision",
    "Measurement",
    "MeasuredController",
    "StaticController",
    "AsyncVecEnv",
    "ClosedError",
    "ConfigError",
    "EnvAttributeError",
    "EnvError",
    "EnvStateError",
    "InvalidActionError",
    "StepResult",
    "StepTimeoutError",
    "VectorEnv",
    "WorkerCrashedError",
    "make",
    "make_vec",
    "run",
]
__version__ = "0.1.0"
del _envs
