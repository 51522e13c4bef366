"""Whether this dashboard may ask engines to move experts (the What-if page's "Apply to the running engine"):
off unless the server says so. `moe-monitor dashboard --apply-run RUN ... --apply-secret-file FILE` passes the
setting to the Streamlit process in its environment:

    MOE_APPLY_RUNS         comma-separated runs Apply is on for (absent or empty: off)
    MOE_APPLY_SECRET_FILE  the file holding the signing secret (or MOE_APPLY_SECRET, the text)
    MOE_APPLY_TTL_S        a request's lifetime, s (default core.layout_requests.DEFAULT_TTL_S)
    REDIS_URL              Apply is on for the listed runs of this Redis only (never a URL typed in the sidebar)

No Streamlit: the page calls gate_from_env() on every run, so the secret is never kept in the session state.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from moe_monitor import core
from moe_monitor.core.apply_secret import SECRET_FILE_ENV, load_secret
from moe_monitor.core.layout_requests import DEFAULT_TTL_S, MAX_TTL_S

RUNS_ENV = "MOE_APPLY_RUNS"
TTL_ENV = "MOE_APPLY_TTL_S"
HOW_TO_TURN_ON = ("start the dashboard with `moe-monitor dashboard --apply-run RUN --apply-secret-file FILE` "
                  "and give the engine the same secret (the EP runtime: `--apply-secret-file FILE` or "
                  f"${SECRET_FILE_ENV})")


@dataclass(frozen=True)
class ApplyGate:
    """runs: the runs Apply is on for, on the server's Redis `redis_url`; secret: the signing secret (None: not
    configured); ttl_s: each request's lifetime; problem: why the setting cannot be used (a bad secret file, a bad
    run name), "" when fine. The secret never appears in repr()."""

    runs: tuple[str, ...] = ()
    redis_url: str = ""
    secret: bytes | None = field(default=None, repr=False)
    ttl_s: float = DEFAULT_TTL_S
    problem: str = ""

    @property
    def enabled(self) -> bool:
        """Apply is on for some run."""
        return bool(self.runs) and self.secret is not None and not self.problem

    def allows(self, redis_url: str, run: str | None) -> bool:
        """Whether Apply is on for run on the Redis at redis_url."""
        return self.enabled and run in self.runs and redis_url == self.redis_url

    def why_off(self, redis_url: str, run: str | None) -> str:
        """One paragraph for the page when allows(redis_url, run) is False: why, and how to turn it on."""
        if self.problem:
            return f"Apply is off: {self.problem}. To turn it on, {HOW_TO_TURN_ON}."
        if not self.runs:
            return f"Apply is off on this dashboard. To turn it on for a run, {HOW_TO_TURN_ON}."
        if self.secret is None:
            return f"Apply is off: no apply secret is configured. To turn it on, {HOW_TO_TURN_ON}."
        if redis_url != self.redis_url:
            return (f"Apply is off for this Redis: it is on for the dashboard's own Redis "
                    f"({core.redact(self.redis_url)}) only.")
        return (f"Apply is off for run {run!r}: this dashboard applies to {', '.join(self.runs)} only. To add it, "
                f"start the dashboard with `--apply-run {run}`.")


def gate_from_env(environ: Mapping[str, str] | None = None) -> ApplyGate:
    """The server's Apply setting from its environment (module docstring); never raises: a setting that cannot be
    used turns Apply off with the reason in .problem."""
    env = os.environ if environ is None else environ
    names = tuple(name.strip() for name in env.get(RUNS_ENV, "").split(",") if name.strip())
    if not names:
        return ApplyGate()
    redis_url = env.get("REDIS_URL", "")
    try:
        runs = tuple(core.check_run_name(name) for name in names)
        secret = load_secret(None, env)
        ttl_s = float(env.get(TTL_ENV) or DEFAULT_TTL_S)
        if not 0 < ttl_s <= MAX_TTL_S:
            raise ValueError(f"${TTL_ENV} must be in (0, {MAX_TTL_S:g}] s")
    except ValueError as exc:
        return ApplyGate(runs=names, redis_url=redis_url, problem=str(exc))
    return ApplyGate(runs=runs, redis_url=redis_url, secret=secret, ttl_s=ttl_s)
