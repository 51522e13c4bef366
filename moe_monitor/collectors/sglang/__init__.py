"""SGLang bridge: SGLang's own expert counts, published to the monitor with no code in SGLang.

    moe-monitor sglang --dump-dir DIR --redis URL --run NAME [--server URL --every SECONDS] [--once]

SGLang counts experts when started with `--expert-distribution-recorder-mode stat|per_pass|per_token` and
writes dumps (torch.save) into SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR when asked (POST
/dump_expert_distribution_record). The bridge watches that folder, turns each complete dump into
core.StepRecords (and core.LayoutRecords when SGLang's physical_to_logical_map changes) and publishes them
through collectors.sinks.RedisSink; with --server it drives the recorder's start / dump / stop endpoints.

Modules, one job each: dumps (the three file formats -> checked arrays; weights_only loading), records
(arrays -> logical counts, tokens, phases, sampled rows), stepids (monotonic step ids and step times),
runmeta (the run metadata and the GPUs of its layout),
folder (which files are complete), state (what was read, kept in Redis), server (the HTTP endpoints),
bridge (the loop), cli (the command line).
"""
from moe_monitor.core.sglang_dumps import PassDump, StatDump, parse_dump, read_dump

from .bridge import Bridge, BridgeOptions, ConfigError

__all__ = ["Bridge", "BridgeOptions", "ConfigError", "PassDump", "StatDump", "parse_dump", "read_dump"]
