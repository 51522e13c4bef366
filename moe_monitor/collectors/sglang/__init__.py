"""SGLang bridge: SGLang's own expert counts, published to the monitor with no code in SGLang.

    moe-monitor sglang --dump-dir DIR --redis URL --run NAME [--server URL --every SECONDS] [--once]

SGLang started with `--expert-distribution-recorder-mode stat|per_pass|per_token` writes dumps into
SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR when asked; the bridge watches that folder, turns each complete dump
into core.StepRecords (and LayoutRecords, PhysicalRecords) and publishes them through collectors.sinks.RedisSink.
Modules: folder (complete files), jobs (a dump -> records), stepids (step ids and times), runmeta (metadata,
GPUs), state (what was read), server (the HTTP endpoints), bridge (the loop), cli. docs/collectors.md.
"""
from moe_monitor.core.sglang_dumps import PassDump, StatDump, parse_dump, read_dump

from .bridge import Bridge, BridgeOptions, ConfigError

__all__ = ["Bridge", "BridgeOptions", "ConfigError", "PassDump", "StatDump", "parse_dump", "read_dump"]
