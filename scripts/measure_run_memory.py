#!/usr/bin/env python3
"""Peak resident memory of a `flywheel run` job (default: Mario 1-1 at 42x42), every process summed, sampled every
5 s: ``python scripts/measure_run_memory.py OUT.json SECONDS [flywheel run flags...]`` (a hand-run measurement)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

import psutil


def main() -> int:
    out, seconds, flags = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    workdir = tempfile.mkdtemp(prefix="flywheel-memory-")
    command = [sys.executable, "-m", "flywheel", "run", "--time-limit", str(seconds), "--no-video", "--base-port",
               "0", "--http-port", "0", "--checkpoint-dir", "ckpt", *flags]
    proc = subprocess.Popen(command, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_total, peak, samples, started = 0, {}, [], time.monotonic()
    while proc.poll() is None:
        try:
            procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            break
        rss: dict[str, int] = {}
        for p in procs:
            try:
                rss[f"{p.pid} {' '.join(p.cmdline()[2:4]) or p.name()}"] = p.memory_info().rss
            except psutil.Error:
                pass
        total = sum(rss.values())
        samples.append({"t": round(time.monotonic() - started, 1), "total_bytes": total})
        if total > peak_total:
            peak_total, peak = total, rss
        time.sleep(5)
    assert proc.stdout is not None
    tail = proc.stdout.read().splitlines()[-3:]
    with open("/proc/loadavg") as fh:
        load = fh.read().strip()
    result = {"command": " ".join(["python scripts/measure_run_memory.py", out, str(seconds), *flags]),
              "peak_total_bytes": peak_total, "peak_total_gib": round(peak_total / 2**30, 3),
              "peak_by_process": peak, "samples": samples, "last_lines": tail, "loadavg_at_end": load}
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"peak {peak_total / 2**30:.2f} GiB; {tail[-1] if tail else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
