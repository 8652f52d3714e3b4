"""The policy registry: names, parameters, help strings and option parsing."""

from __future__ import annotations

import dataclasses

import pytest

import policies
from hermes_cli.cli.catalog import parse_options
from hermes_cli.cli.console import UserError
from policies import POLICIES, Policy, make_policy


def test_registry_order_and_exports():
    assert list(POLICIES) == ["full", "fifo", "sink", "uniform", "infinipot", "hermes"]
    assert "dataclasses" not in policies.__all__
    assert all(hasattr(policies, name) for name in policies.__all__)


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_is_a_dataclass_with_documented_parameters(name):
    cls = POLICIES[name]
    assert issubclass(cls, Policy) and dataclasses.is_dataclass(cls) and cls.name == name
    assert cls.description and cls.__module__ and __import__(cls.__module__, fromlist=["_"]).__doc__
    for field in cls.parameters():
        assert field.metadata.get("help"), f"{name}.{field.name} has no help"
        assert field.default is not dataclasses.MISSING
    assert make_policy(name) == cls()  # the defaults build


def test_spec_defaults():
    assert make_policy("infinipot") == POLICIES["infinipot"](ratio=0.75, alpha=0.5, recent_fraction=0.125, van_pool=False)
    hermes = make_policy("hermes")
    assert (hermes.omega0, hermes.gamma, hermes.k0, hermes.k1) == (0.75, 0.6, 20.0, 12.0)
    assert (hermes.lambda_shallow, hermes.lambda_middle, hermes.lambda_deep) == (0.1, 0.3, 0.4)
    assert (hermes.shallow_fraction, hermes.deep_fraction, hermes.smoothing, hermes.summary) == (0.1, 0.7, True, True)


def test_make_policy_rejects_unknown_names_options_and_types():
    with pytest.raises(ValueError, match=r"unknown policy 'lru'; choose one of: full, fifo, sink"):
        make_policy("lru")
    with pytest.raises(ValueError, match=r"policy 'fifo' has no parameter 'n_sink' \(parameters: none\)"):
        make_policy("fifo", n_sink=4)
    with pytest.raises(ValueError, match=r"policy 'sink' has no parameter 'sinks' \(parameters: n_sink\)"):
        make_policy("sink", sinks=4)
    with pytest.raises(ValueError, match=r"sink.n_sink expects an integer, got '4'"):
        make_policy("sink", n_sink="4")
    with pytest.raises(ValueError, match=r"hermes.summary expects true or false, got 1"):
        make_policy("hermes", summary=1)
    with pytest.raises(ValueError, match=r"infinipot.alpha expects a number, got True"):
        make_policy("infinipot", alpha=True)


def test_make_policy_accepts_an_int_for_a_float():
    policy = make_policy("infinipot", alpha=1)
    assert policy.alpha == 1.0 and isinstance(policy.alpha, float)


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("sink", {"n_sink": -1}, "sink.n_sink must be >= 0"),
        ("infinipot", {"ratio": 0.0}, r"infinipot.ratio must be in \(0, 1\]"),
        ("infinipot", {"alpha": 1.5}, r"infinipot.alpha must be in \[0, 1\]"),
        ("infinipot", {"recent_fraction": 0.0}, "infinipot.recent_fraction"),
        ("hermes", {"shallow_fraction": 0.8}, "shallow_fraction <= deep_fraction"),
        ("hermes", {"lambda_middle": 2.0}, r"hermes.lambda_middle must be in \[0, 1\]"),
    ],
)
def test_out_of_range_parameters_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        make_policy(name, **options)


def test_parse_options_converts_to_the_parameter_type():
    assert parse_options("sink", ["n_sink=392"]) == {"n_sink": 392}
    assert parse_options("infinipot", [" alpha = 0.4 "]) == {"alpha": 0.4}
    assert parse_options("hermes", ["summary=off", "smoothing=YES"]) == {"summary": False, "smoothing": True}
    k0 = parse_options("hermes", ["k0=15"])["k0"]
    assert k0 == 15.0 and isinstance(k0, float)


@pytest.mark.parametrize(
    "policy, text, message",
    [
        ("lru", "a=1", "unknown policy 'lru'"),
        ("sink", "n_sink", "--policy-opt expects KEY=VALUE, got 'n_sink'"),
        ("sink", "size=3", r"policy 'sink' has no parameter 'size' \(parameters: n_sink\)"),
        ("sink", "n_sink=1.5", "sink.n_sink expects an integer, got '1.5'"),
        ("infinipot", "ratio=lots", "infinipot.ratio expects a number, got 'lots'"),
        ("hermes", "summary=maybe", "hermes.summary expects true or false, got 'maybe'"),
    ],
)
def test_parse_options_errors_are_clear(policy, text, message):
    with pytest.raises(UserError, match=message):
        parse_options(policy, [text])


def test_parsed_options_build_the_policy():
    assert make_policy("infinipot", **parse_options("infinipot", ["van_pool=true"])).van_pool is True
