"""What every service reports of its own process: CPU seconds, resident memory and threads, its children's too."""

from __future__ import annotations

import logging

import psutil

from flywheel.metrics_spec import ProcessCounters, ProcessGauges

log = logging.getLogger("flywheel.transport")  # sampled by transport.TelemetryReporter, logged as its lines


class ProcessStats:
    """CPU seconds, resident memory and threads of this process and of its child processes (psutil).

    Children are env workers or checkpoint writers: their CPU is reported apart, as a counter that stays
    monotonic when a child exits (its last reading is kept), so a dashboard can add both.
    """

    def __init__(self) -> None:
        self._proc: psutil.Process | None = psutil.Process()
        self._children: dict[int, float] = {}
        self._exited_cpu = 0.0

    def sample(self) -> tuple[dict[str, float], dict[str, float]]:
        """(counters, gauges); empty when the process table cannot be read (the caller carries on)."""
        if self._proc is None:
            return {}, {}
        try:
            with self._proc.oneshot():
                cpu = self._proc.cpu_times()
                rss = self._proc.memory_info().rss
                threads = self._proc.num_threads()
            kids = self._proc.children(recursive=True)
        except (psutil.Error, OSError) as exc:
            log.warning("process statistics unavailable (%s); not reporting them", exc)
            self._proc = None
            return {}, {}
        seen: dict[int, float] = {}
        kids_rss = running = 0
        for kid in kids:
            try:
                with kid.oneshot():
                    times = kid.cpu_times()
                    if kid.status() != psutil.STATUS_ZOMBIE:
                        kids_rss += kid.memory_info().rss
                        running += 1
                seen[kid.pid] = times.user + times.system
            except (psutil.Error, OSError):
                continue  # exited between the listing and the reading
        self._exited_cpu += sum(last for pid, last in self._children.items() if pid not in seen)
        self._children = seen
        counters = ProcessCounters(process_cpu_seconds_total=cpu.user + cpu.system,
                                   process_children_cpu_seconds_total=self._exited_cpu + sum(seen.values()))
        gauges = ProcessGauges(process_resident_memory_bytes=rss, process_threads=threads,
                               process_children_resident_memory_bytes=kids_rss, process_children=running)
        return counters.as_dict(), gauges.as_dict()
