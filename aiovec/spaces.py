"""Batched views over space-structured buffers, and action validation.

A *view* is what :func:`gymnasium.vector.utils.read_from_shared_memory` returns:
a numpy array of shape ``(num_envs, *shape)`` for a leaf space, or a dict/tuple
of views for ``Dict``/``Tuple`` spaces. These helpers read, write and check
rows of such views without a Python loop over envs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from .errors import InvalidActionError

LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def check_supported(space: spaces.Space, what: str) -> None:
    """Raise ConfigError for spaces that cannot live in fixed-size buffers."""
    from .errors import ConfigError

    if isinstance(space, spaces.Dict):
        for sub in space.spaces.values():
            check_supported(sub, what)
    elif isinstance(space, spaces.Tuple):
        for sub in space.spaces:
            check_supported(sub, what)
    elif not isinstance(space, LEAF_SPACES):
        raise ConfigError(
            f"{what} {space!r} is not supported: aiovec needs fixed-size spaces "
            "(Box, Discrete, MultiDiscrete, MultiBinary, and Dict/Tuple of them)"
        )


def take(view: Any, rows: Any) -> Any:
    """Copy the given rows (an index array, a slice or ``...``) out of a view."""
    if isinstance(view, dict):
        return {k: take(v, rows) for k, v in view.items()}
    if isinstance(view, tuple):
        return tuple(take(v, rows) for v in view)
    return view[rows].copy() if isinstance(rows, slice) else view[rows]


def put_row(view: Any, row: int, value: Any) -> None:
    """Write one env's value into row ``row`` of a view (worker side)."""
    if isinstance(view, dict):
        for k, v in view.items():
            put_row(v, row, value[k])
    elif isinstance(view, tuple):
        for v, x in zip(view, value, strict=True):
            put_row(v, row, x)
    else:
        view[row] = value


def _narrow_float(space: spaces.Space) -> bool:
    return isinstance(space, spaces.Box) and space.dtype.kind == "f" and space.dtype != np.float64


def action_buffer_space(space: spaces.Space) -> spaces.Space:
    """The space of the action buffer: a float ``Box`` narrower than float64 is carried as float64 (at the top or
    inside a Dict/Tuple), so any float action arrives exactly; each env's row is handed to the env in the dtype the
    caller gave it (see :func:`action_dtype_codes`), as ``SyncVectorEnv`` hands over rows of the caller's arrays.
    The space itself where nothing is widened."""
    if _narrow_float(space):
        return spaces.Box(space.low.astype(np.float64), space.high.astype(np.float64), space.shape, np.float64)
    if isinstance(space, spaces.Dict):
        subs = {k: action_buffer_space(s) for k, s in space.spaces.items()}
        return space if all(subs[k] is s for k, s in space.spaces.items()) else spaces.Dict(subs)
    if isinstance(space, spaces.Tuple):
        parts = [action_buffer_space(s) for s in space.spaces]
        return space if all(a is b for a, b in zip(parts, space.spaces, strict=True)) else spaces.Tuple(parts)
    return space


def _widened(space: spaces.Space) -> list[np.dtype]:
    """The dtypes of the leaves :func:`action_buffer_space` widens, in the order every helper here walks them."""
    if _narrow_float(space):
        return [np.dtype(space.dtype)]
    if isinstance(space, spaces.Dict):
        return [d for s in space.spaces.values() for d in _widened(s)]
    if isinstance(space, spaces.Tuple):
        return [d for s in space.spaces for d in _widened(s)]
    return []


def action_dtype_shape(space: spaces.Space, n: int) -> tuple[int, ...] | None:
    """Shape of the per-env dtype codes :func:`action_dtype_codes` keeps: ``(n,)`` for a widened Box, ``(n, k)``
    for a Dict/Tuple with ``k`` widened leaves, None where nothing is widened."""
    k = len(_widened(space))
    if not k:
        return None
    return (n,) if isinstance(space, spaces.Box) else (n, k)


def action_dtype_codes(space: spaces.Space, n: int, fn: Callable[[int], np.ndarray] | None = None) -> np.ndarray | None:
    """Per env (and widened leaf, see :func:`action_dtype_shape`), the dtype of its last action (``ord(dtype.char)``),
    where the buffer's dtype is not the caller's: None for other spaces. Starts at the space's dtypes. ``fn(size)``:
    where the flat array lives (default: a new one)."""
    shape = action_dtype_shape(space, n)
    if shape is None:
        return None
    flat = fn(int(np.prod(shape))) if fn is not None else np.empty(int(np.prod(shape)), dtype=np.uint8)
    codes = flat.reshape(shape)
    codes[...] = [ord(d.char) for d in _widened(space)] if len(shape) == 2 else ord(np.dtype(space.dtype).char)
    return codes


def leaf_dtype_codes(space: spaces.Space, values: Any) -> list[int]:
    """The codes of the caller's dtypes of a checked Dict/Tuple batch's widened leaves (a row of
    :func:`action_dtype_codes`)."""
    if _narrow_float(space):
        return [ord(values.dtype.char)]
    if isinstance(space, spaces.Dict):
        return [c for k, s in space.spaces.items() for c in leaf_dtype_codes(s, values[k])]
    if isinstance(space, spaces.Tuple):
        return [c for s, v in zip(space.spaces, values, strict=True) for c in leaf_dtype_codes(s, v)]
    return []


def row_reader(view: Any, space: spaces.Space, codes: np.ndarray | None) -> Callable[[int], Any]:
    """``get(row)``: one env's Dict/Tuple action as :func:`get_row` reads it, its widened leaves in the dtypes
    ``codes[row]`` names (see :func:`action_dtype_codes`; None: as stored)."""
    if codes is None:
        return lambda row: get_row(view, row)

    def read(v: Any, s: spaces.Space, row: int, it: Any) -> Any:
        if _narrow_float(s):
            return v[row].astype(dtype_of_code(next(it)))  # a copy, as get_row's
        if isinstance(s, spaces.Dict):
            return {k: read(v[k], sub, row, it) for k, sub in s.spaces.items()}
        if isinstance(s, spaces.Tuple):
            return tuple(read(x, sub, row, it) for x, sub in zip(v, s.spaces, strict=True))
        return get_row(v, row)

    return lambda row: read(view, space, row, iter(codes[row].tolist()))


@functools.cache
def dtype_of_code(code: int) -> np.dtype:
    """The dtype an :func:`action_dtype_codes` entry names (``ord(dtype.char)``)."""
    return np.dtype(chr(code))


def row_writer(view: Any) -> Callable[[int, Any], None]:
    """``put(row, value)`` for values an env returned: a leaf whose shape differs from its row's raises
    ``ValueError`` (numpy would broadcast a scalar across the row, or one env's vector across rows), as
    ``SyncVectorEnv`` refuses it; an array of the row's shape costs one type and one shape test."""
    if isinstance(view, dict):
        puts = {k: row_writer(v) for k, v in view.items()}

        def put_dict(row: int, value: Any) -> None:
            for k, put in puts.items():
                put(row, value[k])
        return put_dict
    if isinstance(view, tuple):
        parts = [row_writer(v) for v in view]

        def put_tuple(row: int, value: Any) -> None:
            for put, x in zip(parts, value, strict=True):
                put(row, x)
        return put_tuple
    shape = view.shape[1:]

    def put(row: int, value: Any) -> None:
        if (type(value) is not np.ndarray or value.shape != shape) and np.shape(value) != shape:
            raise ValueError(f"the env returned a value of shape {np.shape(value)} where its space's shape is {shape}")
        view[row] = value
    return put


def get_row(view: Any, row: int) -> Any:
    """Read one env's value from a view, as the single space's sample would look."""
    if isinstance(view, dict):
        return {k: get_row(v, row) for k, v in view.items()}
    if isinstance(view, tuple):
        return tuple(get_row(v, row) for v in view)
    x = view[row]
    # A copy, so an env that keeps its action never sees the next one overwrite it.
    return x.copy() if isinstance(x, np.ndarray) else x


def put_rows(view: Any, rows: Any, values: Any) -> None:
    """Write already-validated batched values into the given rows of a view."""
    if isinstance(view, dict):
        for k, v in view.items():
            put_rows(v, rows, values[k])
    elif isinstance(view, tuple):
        for v, x in zip(view, values, strict=True):
            put_rows(v, rows, x)
    else:
        view[rows] = values


def validate_actions(space: spaces.Space, actions: Any, n: int, path: str = "actions") -> Any:
    """Check a batch of ``n`` actions for ``space``; return them as arrays of the buffer dtype.

    Raises :class:`InvalidActionError` naming the problem (count, shape, dtype, range).
    """
    if isinstance(space, spaces.Dict):
        if not isinstance(actions, dict):
            raise InvalidActionError(f"{path} must be a dict with keys {list(space.spaces)}, got {type(actions).__name__}")
        missing = set(space.spaces) - set(actions)
        if missing:
            raise InvalidActionError(f"{path} is missing keys {sorted(missing)}")
        return {k: validate_actions(s, actions[k], n, f"{path}[{k!r}]") for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(actions, (tuple, list)) or len(actions) != len(space.spaces):
            raise InvalidActionError(f"{path} must be a tuple of {len(space.spaces)} batched parts")
        return tuple(validate_actions(s, a, n, f"{path}[{i}]") for i, (s, a) in enumerate(zip(space.spaces, actions, strict=True)))
    return _validate_leaf(space, actions, n, path)


def _validate_leaf(space: spaces.Space, actions: Any, n: int, path: str) -> np.ndarray:
    if isinstance(actions, np.ndarray):
        arr = actions
    else:
        try:
            arr = np.asarray(actions)
        except Exception as exc:  # ragged lists and the like
            raise InvalidActionError(f"{path} cannot be converted to an array: {exc}") from None
    shape = (n, *space.shape)
    if arr.shape != shape:
        if arr.ndim >= 1 and arr.shape[0] != n:
            raise InvalidActionError(f"{path}: expected {n} actions (one per env), got {arr.shape[0]} (shape {arr.shape})")
        raise InvalidActionError(f"{path}: expected shape {shape} for {space}, got {arr.shape}")
    kind = arr.dtype.kind
    if isinstance(space, spaces.Box):
        if kind not in "biuf":
            raise InvalidActionError(f"{path}: expected numeric actions for {space}, got dtype {arr.dtype}")
        if kind == "f" and space.dtype.kind in "iu":
            raise InvalidActionError(f"{path}: expected integer actions for {space}, got dtype {arr.dtype}")
        if space.dtype.kind in "iu" and not np.can_cast(arr.dtype, space.dtype):
            # Bounds are the env's business (policies' Gaussian actions exceed them, envs clip), but an integer the
            # buffer's dtype cannot hold would reach the env wrapped around (300 as uint8: 44). (Floats cast as numpy
            # casts them: a float64 beyond float32's range becomes inf; checking costs every float64 batch ~7 us.)
            info = np.iinfo(space.dtype)
            bad = (arr < info.min) | (arr > info.max)
            if bad.any():
                row = int(np.argwhere(bad)[0][0])
                raise InvalidActionError(f"{path}: action {arr[row].tolist()} at position {row} does not fit "
                                         f"{space.dtype} ({space}): it would reach the env changed")
        return arr
    if kind not in "biu":
        raise InvalidActionError(f"{path}: expected integer actions for {space}, got dtype {arr.dtype}")
    if isinstance(space, spaces.Discrete):
        # One pass: values below start wrap around to huge unsigned numbers.
        bad = (arr.astype(np.int64, copy=False) - int(space.start)).astype(np.uint64, copy=False) >= int(space.n)
    elif isinstance(space, spaces.MultiDiscrete):
        bad = (arr < space.start) | (arr >= space.start + space.nvec)
    else:  # MultiBinary
        bad = (arr != 0) & (arr != 1)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise InvalidActionError(f"{path}: action {arr[row].tolist()} at position {row} is outside {space}")
    return arr


SMALL_BATCH = 16
"""Up to this many Discrete actions are range-checked as a Python list (faster than numpy there)."""


class ActionChecker:
    """``validate_actions`` for one space and batch size, with a fast path for the common case.

    A numpy array of exactly the buffer's shape and dtype (what a policy usually hands over)
    is checked with one comparison; anything else takes :func:`validate_actions`, which names
    the problem. Built once per vector env: space type checks are not repeated per step.
    """

    def __init__(self, space: spaces.Space, n: int) -> None:
        self.space, self.n = space, n
        self._shape = (n, *space.shape) if isinstance(space, LEAF_SPACES) else None
        self._dtype = np.dtype(space.dtype) if self._shape is not None else None
        self._bound: int | None = None
        if isinstance(space, spaces.Discrete) and int(space.start) == 0 and self._dtype.kind in "iu":
            self._bound = int(space.n)
        self._box = isinstance(space, spaces.Box)
        self._any_float = self._box and self._dtype.kind == "f"  # carried as float64 (action_buffer_space): any float fits
        self._unsigned = np.dtype(f"u{self._dtype.itemsize}") if self._dtype is not None and self._dtype.kind in "iu" else None

    def __call__(self, actions: Any, n: int) -> Any:
        if (n == self.n and type(actions) is np.ndarray and actions.shape == self._shape
                and (actions.dtype is self._dtype or actions.dtype == self._dtype
                     or (self._any_float and actions.dtype.kind == "f"))):
            if self._box:
                return actions
            bound = self._bound
            if bound is not None:
                if n <= SMALL_BATCH:  # a few ints: Python's min/max beat numpy's per-call overhead
                    values = actions.tolist()
                    if min(values) >= 0 and max(values) < bound:
                        return actions
                # Unsigned view: a negative action wraps to a huge number, so one comparison checks both ends.
                elif not np.count_nonzero(actions.view(self._unsigned) >= bound):
                    return actions
        return validate_actions(self.space, actions, n)
