"""Per-agent rate limiting: one token bucket per resolved caller identity.

Each agent may make `rate` requests per second sustained, with bursts of up to `burst`
requests. A request that finds the bucket empty is refused with 429 RATE_LIMITED, and
`Retry-After` says (in whole seconds, rounded up) when one token will be back.

The buckets live in this process: several server processes (`ampkit serve --workers N`, or
servers behind a load balancer) each count separately (see SECURITY.md), and `describe`
says how many share the port. Idle buckets are dropped so that a flood of made-up
agent ids cannot grow memory without bound.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Optional

from ..errors import RateLimited

MAX_BUCKETS = 100_000


class RateLimiter:
    def __init__(self, rate: float, burst: Optional[int] = None, clock: Callable[[], float] = time.monotonic,
                 processes: int = 1):
        if rate <= 0:
            raise ValueError("rate must be positive; use no limiter to turn limiting off")
        self.rate = float(rate)
        self.burst = max(1, int(burst) if burst else math.ceil(2 * rate))
        self.clock = clock
        self.processes = processes  # worker processes on this port, each with buckets of its own
        self._buckets: dict[str, tuple[float, float]] = {}  # agent -> (tokens, last refill time)
        self._lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"requests_per_second": self.rate, "burst": self.burst, "per": "agent"}
        if self.processes > 1:  # an agent's connections may reach each process's buckets
            described.update(per="agent and server process", processes=self.processes)
        return described

    def check(self, agent_id: str) -> None:
        """Take one token for `agent_id`, or raise RateLimited."""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.get(agent_id, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens < 1.0:
                self._buckets[agent_id] = (tokens, now)
                wait = (1.0 - tokens) / self.rate
                raise RateLimited(
                    f"rate limit of {self.rate:g} requests/s per agent exceeded",
                    {"retry_after": max(1, math.ceil(wait)), "limit_per_second": self.rate, "burst": self.burst},
                )
            self._buckets[agent_id] = (tokens - 1.0, now)
            if len(self._buckets) > MAX_BUCKETS:
                self._drop_full_buckets(now)

    def _drop_full_buckets(self, now: float) -> None:
        # A bucket that has refilled to `burst` carries no state worth keeping.
        refill_time = self.burst / self.rate
        for agent, (_, last) in list(self._buckets.items()):
            if now - last >= refill_time:
                del self._buckets[agent]
