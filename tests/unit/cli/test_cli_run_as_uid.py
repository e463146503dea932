"""The CLI and a lease's UID: ``gpushare leases`` shows it (``-`` when its caller did not
say), ``gpushare explain --run-as-uid`` sends it, and a USER_CONFLICT refusal reads like
the others."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.api.proto import agent_pb2 as pb
from agent.cli import leases as leases_cli
from agent.cli import main

CONFLICT = (
    "device's MPS server runs as UID 1000; a client of UID 2000 would wait in CUDA "
    "initialisation until every client of UID 1000 ends (one user per MPS control daemon)"
)


def lease(lease_id: str, uid: int | None) -> pb.Lease:
    found = pb.Lease(lease_id=lease_id, state="admitted", tenant="team-a", trust_domain="team-a")
    if uid is not None:
        found.run_as_uid = uid
    return found


def invoke(tmp_path: Path, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main.cli, ["--socket", str(tmp_path / "s.sock"), *args])
    assert result.exit_code == code, result.output
    return result.output


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> pb.GetNodeResponse:
    answer = pb.GetNodeResponse(leases=[lease("l-known", 1000), lease("l-unknown", None)])
    monkeypatch.setattr(leases_cli, "get_node", lambda *_a, **_k: answer)
    return answer


def test_leases_shows_each_uid_and_a_dash_when_unknown(
    node: pb.GetNodeResponse, tmp_path: Path
) -> None:
    header, *rows = invoke(tmp_path, "leases").splitlines()
    uid_at = header.split().index("UID")
    assert header.split()[uid_at - 1] == "TRUST"
    cells = {row.split()[0]: row.split()[uid_at] for row in rows}
    assert cells == {"l-known": "1000", "l-unknown": "-"}


def test_leases_json_carries_a_known_uid_and_leaves_an_unknown_one_out(
    node: pb.GetNodeResponse, tmp_path: Path
) -> None:
    found = json.loads(invoke(tmp_path, "leases", "--json"))["leases"]
    assert [x.get("run_as_uid") for x in found] == [1000, None]


class Recorder:
    """Stands for the agent's Explain: keeps the request, answers ``decision``."""

    def __init__(self, decision: pb.Decision) -> None:
        self.decision = decision
        self.requests: list[pb.Request] = []

    def __call__(self, _where: Any, method: str, request: pb.AdmitRequest) -> pb.AdmitResponse:
        assert method == "Explain"
        self.requests.append(request.request)
        return pb.AdmitResponse(decision=self.decision)


@pytest.fixture
def refusing(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    attempt = pb.DeviceAttempt(
        device_uuid="GPU-1", fits=False, reason="USER_CONFLICT", detail=CONFLICT
    )
    decision = pb.Decision(
        admitted=False,
        reason="USER_CONFLICT",
        message=f"no device fits: GPU-1: {CONFLICT}",
        attempts=[attempt],
    )
    recorder = Recorder(decision)
    monkeypatch.setattr(leases_cli, "call", recorder)
    return recorder


def test_explain_sends_the_uid_and_shows_a_user_conflict(
    refusing: Recorder, tmp_path: Path
) -> None:
    output = invoke(tmp_path, "explain", "--memory", "1GiB", "--run-as-uid", "2000", code=5)
    (sent,) = refusing.requests
    assert sent.HasField("run_as_uid") and sent.run_as_uid == 2000
    assert output.startswith("REFUSE USER_CONFLICT: no device fits: GPU-1: device's MPS")
    assert any(row.split()[:3] == ["GPU-1", "no", "USER_CONFLICT"] for row in output.splitlines())


def test_explain_without_the_option_leaves_the_uid_unset(
    refusing: Recorder, tmp_path: Path
) -> None:
    invoke(tmp_path, "explain", "--memory", "1GiB", code=5)
    (sent,) = refusing.requests
    assert not sent.HasField("run_as_uid")


@pytest.mark.parametrize("uid", ["-1", "4294967295", "root"])
def test_explain_refuses_a_uid_that_is_not_one(
    refusing: Recorder, tmp_path: Path, uid: str
) -> None:
    output = invoke(tmp_path, "explain", "--memory", "1GiB", "--run-as-uid", uid, code=2)
    assert "--run-as-uid" in output and not refusing.requests
