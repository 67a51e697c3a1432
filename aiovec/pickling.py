"""``dumps``: cloudpickle that keeps the file name of code defined in the main script.

Functions and classes defined in ``__main__`` (env classes and factories in the user's script)
are pickled by value. Since cloudpickle 3.1.3 (cloudpipe/cloudpickle#560) their code objects
travel with ``co_filename = "<dynamic-code>"``, to make payloads deterministic; a traceback
from such an env inside a worker then says ``File "<dynamic-code>"`` instead of the user's
file. This pickler sends the real file name: tracebacks point to the script and line again.
"""

from __future__ import annotations

import io
import types
from collections import ChainMap
from typing import Any

import cloudpickle

_DYNAMIC = "<dynamic-code>"
_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]  # cloudpickle's own reducer for code objects


def _code_reduce_keeping_filename(code: types.CodeType) -> Any:
    reduced = _code_reduce(code)
    if code.co_filename == _DYNAMIC or not isinstance(reduced, tuple) or len(reduced) != 2:
        return reduced
    constructor, args = reduced
    if _DYNAMIC not in args:
        return reduced  # an older cloudpickle: it kept the name already
    return constructor, tuple(code.co_filename if a == _DYNAMIC else a for a in args)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_reduce_keeping_filename}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any, protocol: int | None = None) -> bytes:
    """``cloudpickle.dumps``, except that code keeps the name of the file it was defined in."""
    with io.BytesIO() as f:
        _Pickler(f, protocol=protocol).dump(obj)
        return f.getvalue()
