"""One error tree for the whole agent.

Third-party errors (NVML, DCGM, gRPC, sqlite3, subprocesses) are translated into these at
the boundary that meets them, keeping the original as ``__cause__``. Only ``agent.api``
maps them onto gRPC status codes; the CLI maps them onto exit codes.

    GpushareError
    ├── ConfigError            a setting or file is wrong; names the key (exit code 2)
    ├── ValidationError        a request or record is malformed; names the field
    ├── UnitError              a size or percentage cannot be parsed or rendered
    ├── LeaseTransitionError   a lease state change that the state machine forbids
    ├── AlreadyRunningError    another agent holds the socket or lock (exit code 3)
    ├── SimulationError        a simulated-node description is invalid
    ├── GpuError               the GPU backend failed
    │   └── GpuUnavailableError   no driver or library: the node cannot be managed
    ├── TelemetryError         a counter source failed or went silent
    ├── MpsError               MPS control failed
    │   ├── MpsControlError       a control command failed or was answered with an error
    │   └── MpsDaemonDownError    the device's control daemon is not running
    ├── StateError             the durable store cannot read or write
    ├── NotFoundError          no such lease or gang
    └── ConflictError          the request contradicts the state (an expired gang, ...)
        └── AlreadyExistsError    a request id reused for a different request
"""

from __future__ import annotations


class GpushareError(Exception):
    """Base of every error the agent raises on purpose."""


class ConfigError(GpushareError):
    """A configuration value, file or flag is invalid. ``key`` is the dotted setting name."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


class ValidationError(GpushareError):
    """A request or a record is malformed. ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnitError(GpushareError, ValueError):
    """A size or percentage string cannot be parsed, or a value cannot be rendered."""


class LeaseTransitionError(GpushareError):
    """The lease state machine does not allow this transition."""


class AlreadyRunningError(GpushareError):
    """Another agent instance already holds the lock for this socket."""


class SimulationError(GpushareError):
    """A simulated-node description is invalid."""


class GpuError(GpushareError):
    """The GPU backend (NVML or the simulated node) failed."""


class GpuUnavailableError(GpuError):
    """No usable GPU driver or library on this node."""


class TelemetryError(GpushareError):
    """A counter source failed or returned nothing usable."""


class MpsError(GpushareError):
    """MPS control failed."""


class MpsControlError(MpsError):
    """A control command failed, timed out, or was answered with an error."""


class MpsDaemonDownError(MpsError):
    """The control daemon of a device is not running."""


class StateError(GpushareError):
    """The durable state store cannot read or write."""


class NotFoundError(GpushareError):
    """No lease, gang or device by that id."""


class ConflictError(GpushareError):
    """The request contradicts what is recorded (an expired reservation, a reused id)."""


class PermissionDeniedError(GpushareError):
    """The caller may not act on what another caller made (a lease, a gang, a request id)."""


class AlreadyExistsError(ConflictError):
    """A request id seen before arrives with a different request."""
