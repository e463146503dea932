"""What the NRI plugin asks of the agent: the adjustment of one container being created."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class BindMount:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class Injection:
    """What a container gets: variables (set or replaced), bind mounts, annotations."""

    env: Mapping[str, str]
    mounts: Sequence[BindMount] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


class InjectionRefused(Exception):
    """The container must not be created (the runtime fails its CreateContainer)."""


# (pod, container name, container env "NAME=value") -> its injection, or None: not ours
Injector = Callable[[PodRef, str, Sequence[str]], Awaitable[Injection | None]]
