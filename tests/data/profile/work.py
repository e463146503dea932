"""A stand-in workload for `gpushare profile` tests: its throughput halves for every other
copy running at the same time (each copy keeps a marker file in PROFILE_TEST_DIR)."""

import os
import pathlib
import signal
import sys
import time

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
markers = pathlib.Path(os.environ["PROFILE_TEST_DIR"])
me = markers / f"running-{os.getpid()}"
me.touch()
try:
    while True:
        running = len(list(markers.glob("running-*")))
        print(f"throughput: {100.0 / running:.1f} items/s", flush=True)
        time.sleep(0.05)
finally:
    me.unlink()
