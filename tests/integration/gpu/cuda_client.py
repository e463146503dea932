"""A CUDA client for the GPU tests, run with a lease's environment.

It reads what CUDA reports (multiprocessors, memory), allocates half of ``LIMIT_BYTES``,
runs a matrix product, then tries to allocate one and a half times the limit. It prints
one JSON line and keeps its memory until its standard input closes, so the test can read
the agent's per-lease metrics while the memory is in use.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    import torch  # type: ignore[import-not-found]

    limit_bytes = int(sys.argv[1])
    properties = torch.cuda.get_device_properties(0)
    report: dict[str, object] = {
        "sm_count": properties.multi_processor_count,
        "total_memory_bytes": properties.total_memory,
    }
    held = torch.empty(limit_bytes // 2, dtype=torch.uint8, device="cuda")
    matrix = torch.randn(2048, 2048, device="cuda")
    report["product_sum"] = float((matrix @ matrix).abs().sum().item())
    report["under_limit_ok"] = True
    try:
        extra = torch.empty(limit_bytes * 3 // 2, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        report["over_limit_ok"] = True
        del extra
    except torch.cuda.OutOfMemoryError as error:
        report["over_limit_ok"] = False
        report["over_limit_error"] = str(error).splitlines()[0]
    report["held_bytes"] = held.numel()
    print(json.dumps(report), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
