import pytest

from agent.api import validate
from agent.api.proto import agent_pb2 as pb
from agent.core.errors import ValidationError
from agent.core.types import JobAttributes


@pytest.mark.parametrize("value", ["a\n", "a b", "", "x" * 129, "é", "a\x00"])
def test_identifiers_are_strict(value: str) -> None:
    with pytest.raises(ValidationError):
        validate.identifier(value, "request.request_id")


@pytest.mark.parametrize("value", ["job-1", "team.a/rank:0", "A_b+c=d@e"])
def test_good_identifiers(value: str) -> None:
    assert validate.identifier(value, "f") == value


def good_request(**job: object) -> pb.Request:
    return pb.Request(
        request_id="r",
        tenant="t",
        trust_domain="a",
        priority=pb.BURSTABLE,
        memory_bytes=2**30,
        thread_pct=10,
        job=pb.Job(**job),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("job", "field"),
    [
        ({"job_type": "a b"}, "request.job.job_type"),
        ({"model_type": "x" * 200}, "request.job.model_type"),
        ({"requested_gpus": -1.0}, "request.job.requested_gpus"),
        ({"requested_gpus": float("nan")}, "request.job.requested_gpus"),
        ({"declared_duration_s": float("inf")}, "request.job.declared_duration_s"),
        ({"scheduling_delay_s": -0.5}, "request.job.scheduling_delay_s"),
    ],
)
def test_bad_job_attributes_name_their_field(job: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as error:
        validate.request(good_request(**job))
    assert error.value.field == field


def test_job_attributes_are_optional_and_kept() -> None:
    assert validate.request(good_request()).job == JobAttributes()
    kept = validate.request(
        good_request(job_type="training", generative=True, requested_gpus=0.5)
    ).job
    assert (kept.job_type, kept.generative, kept.requested_gpus) == ("training", True, 0.5)


@pytest.mark.parametrize(
    ("value", "good"),
    [
        ("", True),
        ("team-a/train-42", True),
        ("default/web-7d4b9c-x2x9z", True),
        ("ns/pod.with.dots", True),
        ("ns/" + "a" * 253, True),
        ("Team/pod", False),  # upper case
        ("ns/", False),
        ("/pod", False),
        ("ns/pod/extra", False),
        ("ns/-pod", False),
        ("a" * 64 + "/pod", False),  # a namespace is a DNS label: at most 63
        ("ns/pod\n", False),
        ("ns/" + "a" * 254, False),
    ],
)
def test_a_pod_is_namespace_slash_name(value: str, good: bool) -> None:
    message = good_request()
    message.pod = value
    if good:
        assert validate.request(message).pod == value
    else:
        with pytest.raises(ValidationError, match=r"request\.pod"):
            validate.request(message)


@pytest.mark.parametrize(
    ("sizing", "field"),
    [
        (pb.Sizing(parameters=10**15, mode="training"), "request.sizing"),
        (pb.Sizing(parameters=10, mode="training"), "request.sizing"),
        (
            pb.Sizing(
                parameters=10**9,
                mode="inference",
                layers=2**20,
                kv_heads=2**20,
                head_dim=2**20,
                context_length=2**20,
            ),
            "request.sizing",
        ),
    ],
)
def test_a_sizing_out_of_range_names_the_sizing(sizing: pb.Sizing, field: str) -> None:
    """The caller sent a sizing, not memory_bytes: the refusal names what it sent."""
    message = good_request()
    message.memory_bytes = 0
    message.sizing.CopyFrom(sizing)
    with pytest.raises(ValidationError) as error:
        validate.request(message)
    assert error.value.field == field
    assert "sizing" in str(error.value)


def test_request_ids_of_the_dra_driver_are_kept_for_it() -> None:
    from agent.api.proto import agent_pb2 as pb
    from agent.api.validate import request
    from agent.core.errors import ValidationError

    message = pb.Request(
        request_id="dra:claim-uid:share", tenant="t", trust_domain="t",
        priority=pb.BURSTABLE, memory_bytes=2**30, thread_pct=10,
    )  # fmt: skip
    with pytest.raises(ValidationError, match="the DRA driver's"):
        request(message)
