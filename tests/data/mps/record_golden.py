"""Record the answers of the real nvidia-cuda-mps-control into golden files.

    python tests/data/mps/record_golden.py [BINARY]

Starts a daemon in a temporary pipe directory, runs each command once through the
front-end, and writes ``golden.json``: a list of {"command", "rc", "stdout", "stderr"}.
Commands needing a server or a GPU cannot be recorded here; their formats come from the
binary's format strings and are tested separately.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = [
    "get_server_list",
    "get_client_list 1234",
    "get_client_list",
    "get_default_active_thread_percentage",
    "set_default_active_thread_percentage 50",
    "set_default_active_thread_percentage 12.345",
    "set_default_active_thread_percentage 0",
    "set_default_active_thread_percentage 150",
    "get_active_thread_percentage 1234",
    "set_active_thread_percentage 1234 50",
    "get_default_device_pinned_mem_limit 0",
    "set_default_device_pinned_mem_limit 0 2048M",
    "get_default_device_pinned_mem_limit 0",
    "set_default_device_pinned_mem_limit 0 512M",
    "get_default_device_pinned_mem_limit 0",
    "set_default_device_pinned_mem_limit 0 1.5G",
    "get_default_device_pinned_mem_limit 0",
    "set_default_device_pinned_mem_limit 0 2T",
    "get_default_device_pinned_mem_limit 0",
    "set_default_device_pinned_mem_limit 0 -1G",
    "get_default_device_pinned_mem_limit 0",
    "set_default_device_pinned_mem_limit 0 0",
    "get_default_device_pinned_mem_limit 0",
    "get_device_pinned_mem_limit 1234 0",
    "set_device_pinned_mem_limit 1234 0 1024M",
    "terminate_client 1234 5678",
    "ps",
    "ps -p 1234",
    "shutdown_server 1234",
    "get_default_client_priority",
    "set_default_client_priority 2",
    "start_server",
    "foo",
    "GET_SERVER_LIST",
    "get_server_status 1234",
]


def main() -> None:
    binary = sys.argv[1] if len(sys.argv) > 1 else "nvidia-cuda-mps-control"
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": f"{tmp}/pipe",
            "CUDA_MPS_LOG_DIRECTORY": f"{tmp}/log",
        }
        Path(f"{tmp}/pipe").mkdir()
        Path(f"{tmp}/log").mkdir()
        subprocess.run([binary, "-d"], env=env, check=True)
        time.sleep(0.3)
        records = []
        try:
            for command in COMMANDS:
                done = subprocess.run(
                    [binary],
                    input=command + "\n",
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=False,
                )
                records.append(
                    {
                        "command": command,
                        "rc": done.returncode,
                        "stdout": done.stdout,
                        "stderr": done.stderr,
                    }
                )
        finally:
            subprocess.run([binary], input="quit\n", env=env, text=True, check=False)
    out = Path(__file__).with_name("golden.json")
    out.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {len(records)} answers to {out}")


if __name__ == "__main__":
    main()
