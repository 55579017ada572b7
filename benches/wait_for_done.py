"""Wait until a cflow-tui trace file records its `done` event (exit 0), or time out (exit 1).

Used by benches/tui_overhead.sh to wait for a reply without disturbing it: one process that
wakes 10 times a second and reads only the bytes appended since its last look. A shell loop of
`grep -q …; sleep 0.1` forks two processes per wake-up instead, and on this 2-core machine that
alone slowed headless decode by ~16% (5 pairs, 2026-12-01), which is why it is not used.
Usage: wait_for_done.py TRACE [TIMEOUT_S]
"""
import sys
import time

path = sys.argv[1]
deadline = time.monotonic() + (float(sys.argv[2]) if len(sys.argv) > 2 else 120.0)
pos, carry = 0, b""
while time.monotonic() < deadline:
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            chunk = f.read()
    except FileNotFoundError:
        chunk = b""
    pos += len(chunk)
    window = carry + chunk
    if b'"kind":"done"' in window:
        sys.exit(0)
    carry = window[-64:]
    time.sleep(0.1)
sys.exit(1)
