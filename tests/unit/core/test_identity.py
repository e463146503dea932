"""A process's identity from /proc text, and the lease it belongs to (pure, by tables).

The cgroup lines are real ones, as Kubernetes nodes (systemd and cgroupfs drivers,
containerd, CRI-O, docker, cgroup v1 and v2) and systemd hosts write them.
"""

from __future__ import annotations

import pytest

from agent.core.identity import (
    Attribution,
    CgroupFacts,
    ProcessIdentity,
    attribute,
    cgroup_path,
    marker_from_chunks,
    parse_cgroup,
    start_time_ticks,
    workload_matches,
)

POD_A = "03f3f104-3215-44f2-9686-d4dd1f05a7ed"
CTR_A = "09d185410c4e25236cc24717f881589bb0978b24eafd101624e627a4dd8d3439"
POD_B = "414cbe69-8d5a-4d9f-8ad4-6606f7f69e33"
CTR_B = "38091356e51538f55de271b8822e9cc081a110663e7dc7cebfe5f1fe4ee6d75c"
SLICE_A = "kubepods-burstable-pod03f3f104_3215_44f2_9686_d4dd1f05a7ed.slice"
SLICE_B = "kubepods-burstable-pod414cbe69_8d5a_4d9f_8ad4_6606f7f69e33.slice"
KUBE_A = f"/kubepods.slice/kubepods-burstable.slice/{SLICE_A}/cri-containerd-{CTR_A}.scope"

CRIO_LINES = """\
13:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_4afaafdaef89.slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope
12:cpuset:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_4afaafdaef89.slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope
11:files:/
"""
DOCKER_V1_LINES = """\
12:rdma:/
10:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d4424e6_bb13_42f4_a47a_45a4828bf54d.slice/docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope
"""
CGROUPFS_LINE = """\
11:devices:/kubepods/besteffort/pod74c13223-5a00-11e9-b385-42010a80018d/34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376
"""
CONTAINERD_V1_COLON = """\
11:perf_event:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
"""
CONTAINERD_V1_UNDER_SERVICE = """\
10:blkio:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
"""
KIND_LINE = """\
0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod1e597579_417e_482f_bf65_5fe170c3aebd.slice/cri-containerd-a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e.scope
"""
STATIC_POD_LINE = """\
0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod187bff14cccb94f179e943eacce55bb3.slice/cri-containerd-c203a2647ef1ad78e990157c50331f3b6ef0b03336cf08535d6bf7faa5421415.scope
"""
DOCKER_HOST = """\
0::/system.slice/docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope
"""


@pytest.mark.parametrize(
    ("text", "pod", "container", "unit"),
    [
        (f"0::{KUBE_A}\n", POD_A, CTR_A, None),  # v2, systemd driver, containerd
        (
            CRIO_LINES,
            "a5c1f8d5-1919-434d-add7-4afaafdaef89",
            "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c",
            None,
        ),
        (
            DOCKER_V1_LINES,
            "7d4424e6-bb13-42f4-a47a-45a4828bf54d",
            "d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98",
            None,
        ),
        (  # cgroupfs driver: a pod directory, the container a trailing 64-hex segment
            CGROUPFS_LINE,
            "74c13223-5a00-11e9-b385-42010a80018d",
            "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376",
            None,
        ),
        (
            f"3:memory:/kubepods/pod{POD_B}/{CTR_B}\n",  # cgroupfs, guaranteed QoS
            POD_B,
            CTR_B,
            None,
        ),
        (  # containerd on cgroup v1, "slice:runtime:id"
            CONTAINERD_V1_COLON,
            "0125ec2f-b64a-4868-8f5b-94b56cbab864",
            "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459",
            None,
        ),
        (  # ... and below the runtime's own service, which is walked through
            CONTAINERD_V1_UNDER_SERVICE,
            "0125ec2f-b64a-4868-8f5b-94b56cbab864",
            "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459",
            None,
        ),
        (  # kind: the kubelet's own slice above the pods
            KIND_LINE,
            "1e597579-417e-482f-bf65-5fe170c3aebd",
            "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e",
            None,
        ),
        (  # a static pod: its UID is a hash without dashes
            STATIC_POD_LINE,
            "187bff14cccb94f179e943eacce55bb3",
            "c203a2647ef1ad78e990157c50331f3b6ef0b03336cf08535d6bf7faa5421415",
            None,
        ),
        (f"0::/../../{SLICE_A}/cri-containerd-{CTR_A}.scope\n", POD_A, CTR_A, None),  # cgroupns
        (f"0::/kubepods.slice/kubepods-burstable.slice/{SLICE_A}\n", POD_A, None, None),
        (  # a docker container outside Kubernetes: its scope is also its unit
            DOCKER_HOST,
            None,
            "d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98",
            "docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope",
        ),
        ("0::/system.slice/train.service\n", None, None, "train.service"),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None, None, "session-3.scope"),
        (  # a user's own units are named by the user: the unit is the user manager
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/gpu-job.service\n",
            None,
            None,
            "user@1000.service",
        ),
        ("0::/system.slice/containerd.service\n", None, None, "containerd.service"),
        ("0::/\n", None, None, None),
        ("4:memory:/process_api/4189424e773f19fa4919060c1ce22dc8\n0::/\n", None, None, None),
        ("", None, None, None),
    ],
)
def test_the_cgroup_names_pod_container_and_unit(
    text: str, pod: str | None, container: str | None, unit: str | None
) -> None:
    facts = parse_cgroup(text)
    assert (facts.pod_uid, facts.container_id, facts.unit) == (pod, container, unit)


@pytest.mark.parametrize(
    ("text", "pod", "container", "unit"),
    [
        (  # sub-cgroups a tenant names inside its own container are not believed
            f"0::{KUBE_A}/{SLICE_B}/cri-containerd-{CTR_B}.scope\n",
            POD_A,
            CTR_A,
            None,
        ),
        (  # nor inside a user's delegated subtree
            f"0::/user.slice/user-1000.slice/user@1000.service/{SLICE_B}/cri-containerd-{CTR_B}"
            ".scope\n",
            None,
            None,
            "user@1000.service",
        ),
        (  # nor inside a service's
            f"0::/system.slice/job.service/{SLICE_B}/{CTR_B}\n",
            None,
            None,
            "job.service",
        ),
    ],
)
def test_only_the_trusted_part_of_the_path_counts(
    text: str, pod: str | None, container: str | None, unit: str | None
) -> None:
    facts = parse_cgroup(text)
    assert (facts.pod_uid, facts.container_id, facts.unit) == (pod, container, unit)


def test_v1_lines_prefer_the_systemd_hierarchy_then_v2_then_memory() -> None:
    text = "9:memory:/kubepods/x\n1:name=systemd:/system.slice/a.service\n0::/system.slice/b\n"
    assert cgroup_path(text) == "/system.slice/a.service"
    assert cgroup_path("9:memory:/m\n0::/v2\n") == "/v2"
    assert cgroup_path("9:memory:/m\n5:pids:/p\n0::/\n") == "/m"
    assert cgroup_path("7:blkio:/b\n") == "/b"


def test_a_lease_id_in_the_cgroup_path_is_kept_as_a_hint() -> None:
    facts = parse_cgroup("0::/system.slice/job-l-AbCdEfGhIjKlMnOp.service\n")
    assert facts.lease_id == "l-AbCdEfGhIjKlMnOp"
    assert facts.unit == "job-l-AbCdEfGhIjKlMnOp.service"


def test_start_time_is_field_22_whatever_the_command_name_holds() -> None:
    real = (
        "15164 (python3) R 15160 15160 5228 0 -1 4194304 2842 6547 0 0 2 1 3 1 20 0 1 0 "
        "3070123 16961536 3351 18446744073709551615 94259630845952 0"
    )
    assert start_time_ticks(real) == 3070123
    tricky = real.replace("(python3)", "(a) S 1 2 (b))")
    assert start_time_ticks(tricky) == 3070123


ENVIRON = b"SECRET=hunter2\0GPUSHARE_LEASE_ID=l-abc\0OTHER=x\0"


@pytest.mark.parametrize("size", range(1, len(ENVIRON) + 1))
def test_the_marker_is_found_across_any_chunk_boundary(size: int) -> None:
    chunks = [ENVIRON[i : i + size] for i in range(0, len(ENVIRON), size)]
    assert marker_from_chunks(chunks, "GPUSHARE_LEASE_ID") == "l-abc"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (b"A=1\0B=2\0", None),
        (b"GPUSHARE_LEASE_ID=l-1\0GPUSHARE_LEASE_ID=l-2\0", "l-1"),  # the first, as getenv
        (b"GPUSHARE_LEASE_IDX=l-1\0XGPUSHARE_LEASE_ID=l-2\0", None),
        (b"BIG=" + b"x" * 100_000 + b"\0GPUSHARE_LEASE_ID=l-3", "l-3"),  # no trailing NUL
        (b"GPUSHARE_LEASE_ID=" + b"l" * 300 + b"\0", None),  # too long to be a lease id
        (b"GPUSHARE_LEASE_ID=\xff\xfe\0", None),
        (b"GPUSHARE_LEASE_ID=\0", None),
        (b"", None),
    ],
)
def test_the_marker_scan(environ: bytes, expected: str | None) -> None:
    chunks = [environ[i : i + 4096] for i in range(0, len(environ), 4096)]
    assert marker_from_chunks(chunks, "GPUSHARE_LEASE_ID") == expected


@pytest.mark.parametrize(
    ("workload", "facts", "matches"),
    [
        (f"pod:{POD_A}", CgroupFacts(POD_A, CTR_A), True),
        (f"pod:{POD_A.upper()}", CgroupFacts(POD_A, CTR_A), True),
        (f"pod:{POD_B}", CgroupFacts(POD_A, CTR_A), False),
        (f"container:{CTR_A}", CgroupFacts(POD_A, CTR_A), True),
        (f"container:{CTR_A[:12]}", CgroupFacts(POD_A, CTR_A), True),  # a 12-hex prefix
        (f"container:{CTR_A[:11]}", CgroupFacts(POD_A, CTR_A), False),  # too short
        (f"container:{CTR_B[:12]}", CgroupFacts(POD_A, CTR_A), False),
        (f"container:{CTR_A}", CgroupFacts(), False),
        ("unit:train.service", CgroupFacts(unit="train.service"), True),
        ("unit:train.service", CgroupFacts(unit="other.service"), False),
        ("unit:train.service", CgroupFacts(), False),
        ("", CgroupFacts(POD_A), False),
        ("pod:", CgroupFacts(), False),
        # the pods a shared claim is reserved for
        (f"pods:{POD_B},{POD_A}", CgroupFacts(POD_A, CTR_A), True),
        (f"pods:{POD_A.upper()}", CgroupFacts(POD_A, CTR_A), True),
        (f"pods:{POD_B}", CgroupFacts(POD_A, CTR_A), False),
        (f"pods:{POD_A}", CgroupFacts(unit="train.service"), False),
        ("pods:", CgroupFacts(POD_A), False),
    ],
)
def test_a_workload_matches_its_cgroup(workload: str, facts: CgroupFacts, matches: bool) -> None:
    assert workload_matches(workload, facts) is matches


IN_A = CgroupFacts(POD_A, CTR_A)
NOWHERE = CgroupFacts(unit="session-3.scope")
LEASES = {
    "l-a": f"pod:{POD_A}",
    "l-a-ctr": f"container:{CTR_A[:12]}",
    "l-b": f"pod:{POD_B}",
    "l-free": "",
    "l-free2": "",
    "l-shared": f"pods:{POD_B},{POD_A}",
}


@pytest.mark.parametrize(
    ("facts", "hint", "leases", "lease_id", "by_cgroup", "mismatch"),
    [
        (IN_A, None, {"l-a": LEASES["l-a"]}, "l-a", True, False),  # the cgroup decides
        (IN_A, "l-a", LEASES, "l-a", True, False),  # the hint picks among matches
        (IN_A, None, LEASES, "l-a-ctr", True, False),  # else the most specific
        (IN_A, "l-shared", LEASES, "l-shared", True, False),  # a shared claim's, its pod's
        # a pod that joined the shared claim since it was read: the hint, not a lie
        (NOWHERE, "l-shared", LEASES, "l-shared", False, False),
        (CgroupFacts(POD_B), "l-shared", {"l-shared": f"pods:{POD_A}"}, "l-shared", False, False),
        (CgroupFacts(POD_B), None, LEASES, "l-b", True, False),  # its own pod's lease first
        (IN_A, "l-b", LEASES, "l-a-ctr", True, True),  # another pod's lease: a lie
        (NOWHERE, "l-b", LEASES, None, False, True),  # ... and it belongs to none
        (NOWHERE, "l-free", LEASES, "l-free", False, False),  # no workload: hint accepted
        (IN_A, "l-free", LEASES, "l-a-ctr", True, True),  # but never against the cgroup
        (NOWHERE, "l-ended", LEASES, None, False, False),  # no live lease: ignored
        (IN_A, "l-ended", LEASES, "l-a-ctr", True, False),
        (NOWHERE, None, LEASES, None, False, False),
        (CgroupFacts(), "l-free2", {}, None, False, False),
    ],
)
def test_attribution(
    facts: CgroupFacts,
    hint: str | None,
    leases: dict[str, str],
    lease_id: str | None,
    by_cgroup: bool,
    mismatch: bool,
) -> None:
    result = attribute(ProcessIdentity(41, 7, facts, hint), leases)
    assert (result.lease_id, result.by_cgroup, result.mismatch is not None) == (
        lease_id,
        by_cgroup,
        mismatch,
    )


def test_a_mismatch_names_the_pid_the_hinted_lease_and_what_the_cgroup_says() -> None:
    result = attribute(ProcessIdentity(41, 7, IN_A, "l-b"), {"l-b": f"pod:{POD_B}"})
    assert result == Attribution(None, mismatch=result.mismatch)
    assert result.mismatch is not None
    for part in ("process 41", "l-b", f"pod:{POD_B}", f"pod {POD_A}", "no lease"):
        assert part in result.mismatch


def test_the_cgroup_lease_id_is_a_hint_like_the_marker() -> None:
    facts = CgroupFacts(unit="job-l-AbCdEfGhIjKlMnOp.service", lease_id="l-AbCdEfGhIjKlMnOp")
    free = attribute(ProcessIdentity(41, 7, facts), {"l-AbCdEfGhIjKlMnOp": ""})
    assert free == Attribution("l-AbCdEfGhIjKlMnOp")
    bound = attribute(ProcessIdentity(41, 7, facts), {"l-AbCdEfGhIjKlMnOp": f"pod:{POD_A}"})
    assert bound.lease_id is None and bound.mismatch is not None
