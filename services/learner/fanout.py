"""The weights fan-out budget: when the learner's weights PUB may send again, from its subscribers and message size."""

from __future__ import annotations

import math

RELEASE = 2.0  # the budget stops binding when a new version finds it free for this many intervals (hysteresis)


def fanout_interval(subscribers: int, message_bytes: int, bytes_per_s: float) -> float:
    """Seconds one send of ``message_bytes`` to ``subscribers`` takes of a budget of ``bytes_per_s`` (0: none)."""
    if bytes_per_s <= 0 or subscribers <= 0:
        return 0.0
    return subscribers * message_bytes / bytes_per_s


class FanoutShaper:
    """When the weights PUB sends: sends are at least ``fanout_interval`` apart, republishes too (and at least
    ``republish_s`` apart). Pure: the caller gives the time, subscriber count and message size, and sends.

    ``offer`` is a new version: sent at once when the budget allows, else it waits (``deferred_total`` counts
    those) and a newer version offered meanwhile replaces it, so subscribers get the newest, never a queue.
    ``joined`` is a new subscriber: the newest goes again as soon as the budget allows, so an actor that starts or
    reconnects acts within one budget interval instead of up to ``republish_s`` (the last-value cache of the ZeroMQ
    guide; with 256 actors joining at once the budget still spaces the sends, each reaching every one joined so far).
    ``due`` says when the waiting version, or a republish of the newest, may go. ``binding`` turns on at the first
    deferral and off when a new version finds the budget free for ``RELEASE`` intervals (so it does not flap).
    """

    def __init__(self, bytes_per_s: float, republish_s: float) -> None:
        self.bytes_per_s, self.republish_s = bytes_per_s, republish_s
        self.last_send = -math.inf
        self.waiting = False  # a new version waits for the budget
        self.binding = False
        self.deferred_total = 0

    def interval(self, subscribers: int, message_bytes: int) -> float:
        return fanout_interval(subscribers, message_bytes, self.bytes_per_s)

    def offer(self, now: float, subscribers: int, message_bytes: int) -> bool:
        """A new version is ready: True to send it now (then call ``sent``), False when it waits."""
        interval = self.interval(subscribers, message_bytes)
        since = now - self.last_send
        if since >= interval:
            if since >= RELEASE * interval:
                self.binding = False
            return True
        self.waiting = self.binding = True
        self.deferred_total += 1
        return False

    def joined(self) -> None:
        """A subscriber joined: the newest is owed to it, sent once the budget allows (not counted as deferred)."""
        self.waiting = True

    def due(self, now: float, subscribers: int, message_bytes: int) -> bool:
        """Whether to send the newest version now: the waiting one once the budget allows, else a republish."""
        interval = self.interval(subscribers, message_bytes)
        return now - self.last_send >= (interval if self.waiting else max(interval, self.republish_s))

    def sent(self, now: float) -> None:
        self.last_send, self.waiting = now, False
