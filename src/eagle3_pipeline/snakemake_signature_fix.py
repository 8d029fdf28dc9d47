"""Snakemake 9 inspects a function's signature at every call of it while it plans: a version-gated fix.

`snakemake.common.get_function_params` (9.27.1 here) returns `inspect.signature(func).parameters`, and
Snakemake asks it before each call of an input function, a params function and each resource of each
job (which of `wildcards`, `input`, `threads`, `attempt`... the function takes), up to three times per
call: about eight `inspect.signature` per job, 3.5-6 of a 1,000-shard dry run's 26 CPU seconds.

`install()` keeps each answer for a plain Python function (a bound method: its function's, less the
first parameter, as inspect does), as long as what inspect reads to build it is the same objects:
its code, defaults, keyword defaults and annotations, and no `__wrapped__` or `__signature__` of its
own. Anything else (a partial, a callable object, a builtin, a function given either attribute) is
inspected per call as before. The answers are Snakemake's own (tests/unit/test_snakemake_signature_fix.py).

Gated on what it fixes: Snakemake 9.x whose `get_function_params` calls `inspect.signature` (found in
its source); anything else is left as it is.
"""

from __future__ import annotations

import inspect
import sys
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any

PER_CALL = "inspect.signature(func).parameters"
PATCHED = "_eagle3_pipeline_signature_kept"  # marks the patched get_function_params

# function -> (what its signature is built from, its parameters as a function, as a bound method)
_KEPT: weakref.WeakKeyDictionary[types.FunctionType, tuple[tuple[Any, ...], dict[bool, Any]]] = (
    weakref.WeakKeyDictionary()
)


def affected(get_function_params: Callable[..., Any]) -> bool:
    """Whether `get_function_params` is the version that inspects the function at every call."""
    import snakemake

    if not str(snakemake.__version__).startswith("9."):
        return False
    try:
        return PER_CALL in inspect.getsource(get_function_params)
    except (OSError, TypeError):
        return False


def _plain(func: Any) -> tuple[types.FunctionType, bool] | None:
    """The plain function whose signature gives `func`'s, and whether `func` is it bound; None for
    any other callable."""
    bound = type(func) is types.MethodType
    function = func.__func__ if bound else func
    if type(function) is not types.FunctionType:
        return None
    if "__wrapped__" in function.__dict__ or "__signature__" in function.__dict__:
        return None
    return function, bound


def _sources(function: types.FunctionType) -> tuple[Any, ...]:
    """What inspect builds a plain function's signature from."""
    return function.__code__, function.__defaults__, function.__kwdefaults__, function.__annotations__


def kept_parameters(func: Any, original: Callable[[Any], Mapping[str, Any]]) -> Mapping[str, Any]:
    """`original(func)`, computed once per plain function (and once bound) while it stays the same."""
    plain = _plain(func)
    if plain is None:
        return original(func)
    function, bound = plain
    sources = _sources(function)
    kept = _KEPT.get(function)
    if kept is None or any(a is not b for a, b in zip(kept[0], sources, strict=True)):
        kept = (sources, {})
        _KEPT[function] = kept
    if bound not in kept[1]:
        kept[1][bound] = original(func)
    return kept[1][bound]


def install() -> bool:
    """Patch Snakemake's get_function_params once per process; True when the fix is (now or already)
    in place."""
    import snakemake.api  # noqa: F401 - loads snakemake.rules and .jobs, which import the function
    import snakemake.common

    current = snakemake.common.get_function_params
    if getattr(current, PATCHED, False):
        return True
    if not affected(current):
        return False
    original, overwrite = current, snakemake.common.FUNC_OVERWRITE_PARAMS_ATTR

    def get_function_params(func: Callable[..., Any]) -> Mapping[str, Any]:
        if hasattr(func, overwrite):  # Snakemake's own override, read as it reads it
            return getattr(func, overwrite)
        return kept_parameters(func, original)

    get_function_params.__wrapped__ = original  # type: ignore[attr-defined]  # for the tests
    setattr(get_function_params, PATCHED, True)
    # every Snakemake module that imported the function by name (snakemake.common's own callers, rules,
    # jobs), as loaded now: a module loaded later keeps Snakemake's
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "snakemake" and getattr(module, "get_function_params", None) is original:
            module.get_function_params = get_function_params  # type: ignore[attr-defined]
    return True
