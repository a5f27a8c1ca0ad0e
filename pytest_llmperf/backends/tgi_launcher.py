"""text-generation-launcher's arguments: `TGILauncherArgs` holds those of seeds 000/001 and builds the command line
that the llmperf_tgi fixture (servers/fixtures.py) starts; tgi.py is the client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..measure.backend import BackendError

QUANTIZE = (
    "awq",
    "compressed-tensors",
    "eetq",
    "exl2",
    "gptq",
    "marlin",
    "bitsandbytes",
    "bitsandbytes-nf4",
    "bitsandbytes-fp4",
    "fp8",
)


@dataclass(frozen=True)
class TGILauncherArgs:
    """`text-generation-launcher` arguments (seed 000's "text_generation_launcher: Args").

    None leaves the launcher's own default. `extra_args` are appended as given.
    """

    model_id: str
    num_shard: int | None = None
    quantize: str | None = None
    dtype: str | None = None
    revision: str | None = None
    sharded: bool | None = None
    max_concurrent_requests: int | None = None
    max_best_of: int | None = None
    max_stop_sequences: int | None = None
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    max_batch_size: int | None = None
    waiting_served_ratio: float | None = None
    max_waiting_tokens: int | None = None
    trust_remote_code: bool = False
    disable_custom_kernels: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.quantize is not None and self.quantize not in QUANTIZE:
            raise BackendError(f"TGI: --quantize {self.quantize!r} is not one of {', '.join(QUANTIZE)}")
        if self.num_shard is not None and self.num_shard < 1:
            raise BackendError(f"TGI: num_shard must be >= 1, got {self.num_shard}")

    def argv(
        self,
        launcher: str,
        *,
        host: str,
        port: int,
        prometheus_port: int | None = None,
        shard_uds_path: str | None = None,
        master_port: int | None = None,
    ) -> list[str]:
        """The launcher's command line. Host, ports and the shard socket are per server, so that
        two launchers (or a leftover one) never share the defaults 3000/9000/29500 and
        /tmp/text-generation-server."""
        argv = [launcher, "--model-id", self.model_id, "--hostname", host, "--port", str(port)]
        if prometheus_port is not None:
            argv += ["--prometheus-port", str(prometheus_port)]
        if shard_uds_path is not None:
            argv += ["--shard-uds-path", shard_uds_path]
        if master_port is not None:
            argv += ["--master-port", str(master_port)]
        for f in dataclasses.fields(self):
            if f.name in ("model_id", "extra_args"):
                continue
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                if f.name == "sharded":
                    argv += [flag, "true" if value else "false"]
                elif value:
                    argv.append(flag)
            elif value is not None:
                argv += [flag, str(value)]
        return [*argv, *self.extra_args]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["extra_args"] = list(self.extra_args)
        return data


SEED_MAX_INPUT_TOKENS = 1000

SEED_MAX_TOTAL_TOKENS = 1512


def seed_launcher_args(
    model_id: str,
    num_shard: int = 1,
    quantize: str | None = None,
    *,
    sequence_length: int = 1024,
    decode_length: int = 8,
    extra_args: Sequence[str] = (),
) -> TGILauncherArgs:
    """Seed 000's launcher settings (bloomz-7b1-mt experiment), with limits that admit the scenario.

    The seed lists max_input_length 1000 beside sequence length 1024: its text-generation-benchmark
    sends batches to the shards over gRPC, past the router. We go through the router's HTTP API,
    which rejects `truncate` above max_input_tokens and inputs + max_new_tokens above
    max_total_tokens (validation.rs), so both are raised to the scenario where the seed's are lower.
    """
    return TGILauncherArgs(
        model_id=model_id,
        num_shard=num_shard,
        quantize=quantize,
        max_concurrent_requests=128,
        max_best_of=2,
        max_stop_sequences=4,
        max_input_tokens=max(SEED_MAX_INPUT_TOKENS, sequence_length),
        max_total_tokens=max(SEED_MAX_TOTAL_TOKENS, sequence_length + decode_length),
        max_batch_total_tokens=32000,
        max_waiting_tokens=20,
        extra_args=tuple(extra_args),
    )
