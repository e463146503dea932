"""The setting estimator.coverage: a share between 0.5 and 0.99."""

import pytest

from agent.config import load_settings
from agent.core.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "ok"), [("0.5", True), ("0.9", True), ("0.99", True), ("0.4", False), ("1.0", False)]
)
def test_coverage_is_bounded(value: str, ok: bool) -> None:
    env = {"GPUSHARE_ESTIMATOR_COVERAGE": value}
    if ok:
        assert load_settings(env=env).estimator.coverage == float(value)
    else:
        with pytest.raises(ConfigError) as info:
            load_settings(env=env)
        assert "estimator.coverage" in str(info.value)


def test_the_default_is_ninety_percent() -> None:
    assert load_settings().estimator.coverage == 0.9
