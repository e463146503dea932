import pytest

from agent.api import validate
from agent.core.errors import ValidationError


@pytest.mark.parametrize("value", ["a\n", "a b", "", "x" * 129, "é", "a\x00"])
def test_identifiers_are_strict(value: str) -> None:
    with pytest.raises(ValidationError):
        validate.identifier(value, "request.request_id")


@pytest.mark.parametrize("value", ["job-1", "team.a/rank:0", "A_b+c=d@e"])
def test_good_identifiers(value: str) -> None:
    assert validate.identifier(value, "f") == value
