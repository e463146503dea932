"""A device as people name it: its index in ``gpushare status``, its UUID, or a unique
prefix of its UUID (with or without ``GPU-``/``MIG-``, any case). A name of digits only is
an index."""

from __future__ import annotations

from collections.abc import Sequence

from agent.api.proto import agent_pb2 as pb


class DeviceNameError(Exception):
    """No device, or more than one, answers to the name; the message lists the valid ones."""


def resolve_device(name: str, devices: Sequence[pb.Device]) -> str:
    """The UUID of the one device ``name`` designates."""
    text = name.strip()
    if text.isdigit():  # an index, never a UUID prefix: "9" must not pick GPU-96...
        by_index = [d for d in devices if d.index == int(text)]
        if by_index:
            return by_index[0].uuid
        raise DeviceNameError(f"no device with index {text} on this node; {valid_names(devices)}")
    exact = [d for d in devices if d.uuid.lower() == text.lower()]
    if exact:
        return exact[0].uuid
    matches = [d for d in devices if text and _prefixed(d.uuid, text)]
    if len(matches) == 1:
        return matches[0].uuid
    if matches:
        raise DeviceNameError(
            f"{text!r} names {len(matches)} devices ({', '.join(d.uuid for d in matches)}): "
            "give more of the UUID"
        )
    raise DeviceNameError(f"no device {_shown(text)!r} on this node; {valid_names(devices)}")


def valid_names(devices: Sequence[pb.Device]) -> str:
    if not devices:
        return "this node has no devices"
    listed = ", ".join(f"{d.index} ({d.uuid})" for d in sorted(devices, key=lambda d: d.index))
    return f"valid: {listed}, or a unique prefix of a UUID"


def _prefixed(uuid: str, text: str) -> bool:
    """Is ``text`` a prefix of ``uuid``, with its ``GPU-``/``MIG-`` or without?"""
    uuid, text = uuid.lower(), text.lower()
    return uuid.startswith(text) or uuid.partition("-")[2].startswith(text)


def _shown(text: str) -> str:
    return text if len(text) <= 64 else text[:64] + "…"
