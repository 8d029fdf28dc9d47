"""The Snakefile's fix of Snakemake 9's per-call signature inspection
(eagle3_pipeline.snakemake_signature_fix): the parameters Snakemake's own get_function_params gives, for
every kind of callable a rule may hold, inspected once per plain function while it stays the same."""

from __future__ import annotations

import functools
import inspect

import snakemake.api  # noqa: F401 - loads snakemake.rules and .jobs (their import cycle)
import snakemake.common
import snakemake.jobs
import snakemake.rules

from eagle3_pipeline import snakemake_signature_fix


def plain(wildcards, input, threads=1):
    return threads


def keyword_only(wildcards, *, attempt, **rest):
    return attempt


class Resource:
    def evaluate(self, wildcards, input=None):
        return input

    @classmethod
    def of_class(cls, wildcards, attempt):
        return attempt

    @staticmethod
    def static(wildcards):
        return wildcards

    def __call__(self, wildcards, threads):
        return threads


@functools.wraps(plain)
def wrapped(*args, **kwargs):
    return plain(*args, **kwargs)


def declared(wildcards, **anything):
    return anything


declared.__signature__ = inspect.signature(plain)  # type: ignore[attr-defined]


def _described(parameters) -> list[tuple]:
    """What Snakemake reads of the parameters: names, kinds and defaults, in order."""
    return [(name, p.kind, p.default) for name, p in parameters.items()]


def _callables() -> list:
    resource = Resource()
    return [
        plain,
        keyword_only,
        lambda wildcards: wildcards,
        lambda wildcards, input, attempt=1: attempt,
        resource.evaluate,  # a new bound method at each access, as Resource.evaluate in Snakemake
        Resource().evaluate,
        resource.of_class,
        Resource.static,
        resource,  # a callable object
        functools.partial(plain, threads=4),
        wrapped,
        declared,
        len,  # a builtin
    ]


def test_snakemake_9_here_is_the_affected_version():
    assert snakemake_signature_fix.install()  # Snakemake 9.27.1: inspect.signature at every call
    original = snakemake.common.get_function_params.__wrapped__
    assert snakemake_signature_fix.PER_CALL in inspect.getsource(original)
    for module in (snakemake.common, snakemake.rules, snakemake.jobs):  # where Snakemake calls it from
        assert getattr(module.get_function_params, snakemake_signature_fix.PATCHED)
    assert snakemake_signature_fix.install()  # once per process: a second call changes nothing


def test_the_fix_gives_snakemake_s_parameters_for_every_kind_of_callable():
    assert snakemake_signature_fix.install()
    fixed = snakemake.common.get_function_params
    original = fixed.__wrapped__
    for func in _callables():
        for _ in range(3):  # first asked, then answered from what was kept
            assert _described(fixed(func)) == _described(original(func)), func


def test_snakemake_s_own_override_is_read_as_snakemake_reads_it():
    assert snakemake_signature_fix.install()

    def subpath(*args):
        return args

    snakemake.common.overwrite_function_params(subpath, ["wildcards", "input"])
    assert snakemake.common.get_function_params(subpath) == ["wildcards", "input"]


def test_a_function_changed_in_place_is_inspected_again():
    assert snakemake_signature_fix.install()
    fixed = snakemake.common.get_function_params

    def func(wildcards, threads=1):
        return threads

    assert list(fixed(func)) == ["wildcards", "threads"]
    func.__code__ = keyword_only.__code__
    func.__defaults__ = None
    assert _described(fixed(func)) == _described(inspect.signature(func).parameters)
    assert list(fixed(func)) == ["wildcards", "attempt", "rest"]
    func.__kwdefaults__ = {"attempt": 3}
    assert fixed(func)["attempt"].default == 3
    func.__wrapped__ = plain  # now inspect follows it: so does the fix
    assert list(fixed(func)) == list(inspect.signature(func).parameters) == ["wildcards", "input", "threads"]


def test_a_plain_function_is_inspected_once(monkeypatch):
    assert snakemake_signature_fix.install()
    calls = []
    real = inspect.signature

    def counting(func, *args, **kwargs):
        calls.append(func)
        return real(func, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", counting)

    def input_function(wildcards):
        return []

    class Evaluated:  # new here: nothing of it kept by another test
        def evaluate(self, wildcards, input=None):
            return input

    resource = Evaluated()
    for _ in range(100):  # a rule's input function and a resource's evaluate, asked for each of 100 jobs
        snakemake.common.get_function_params(input_function)
        snakemake.common.get_input_function_aux_params(resource.evaluate, {"input": [], "threads": 1})
    assert len(calls) == 2
    calls.clear()
    for _ in range(100):
        snakemake.common.get_function_params.__wrapped__(input_function)
    assert len(calls) == 100  # Snakemake's own
