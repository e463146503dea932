"""Exit codes of the ``gpushare`` command (documented in docs/cli.md)."""

OK = 0
FAILURE = 1  # the agent failed at run time (a crashed core task, no GPU, ...)
CONFIG = 2  # bad configuration, node file or usage
ALREADY_RUNNING = 3  # another agent holds the socket
UNREACHABLE = 4  # a CLI command could not reach the agent
REFUSED = 5  # `gpushare explain`: the agent would refuse the admission
