"""An agent run as a real process by a test cluster: started, SIGKILLed, stopped with
SIGTERM, its log read back. Mixed into the clusters' node classes, which give ``root``,
``process`` and ``command()``."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.helpers import subprocess_env


class AgentProcess:
    root: Path
    process: subprocess.Popen[bytes] | None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        with open(self.root / "agent.log", "ab") as log:
            self.process = subprocess.Popen(
                self.command(), env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=log
            )

    def kill(self) -> None:
        """SIGKILL: no goodbye to anyone."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self.process = None

    def log_text(self) -> str:
        path = self.root / "agent.log"
        return path.read_text(errors="replace") if path.exists() else ""
