"""A MoE model with random weights made in place, for shapes whose checkpoint cannot be stored.

Non-expert weights are made directly on the fast device (from the meta device, nothing read from disk);
the experts are generated there too, per layer, when the engine splits them into tiers. Timing depends
on shapes, not weights (`OffloadEngine.from_config`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .options import DTYPES, OffloadOptions
from .seam import ExpertsSite, find_experts


def random_model(
    config: Any, options: OffloadOptions, seed: int = 0
) -> tuple[torch.nn.Module, list[ExpertsSite], Callable[[Any], Any]]:
    """The model (on the fast device, experts emptied), its experts sites, and the engine's weight source:
    `source(site)` gives `(make(ids) -> (gate_up, down), gate_up_shape, down_shape)` for that layer."""
    from transformers import AutoModelForCausalLM

    fast = torch.device(options.resolved_fast_device())
    dtype = DTYPES[options.dtype]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    sites = find_experts(model)
    gen = torch.Generator(device=fast).manual_seed(seed)
    shapes = {id(s.module): (tuple(s.module.gate_up_proj.shape), tuple(s.module.down_proj.shape)) for s in sites}
    for s in sites:
        s.adapter.detach(s.module, torch.device("meta"))
    model.to_empty(device=fast)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.numel() == 0:
                continue
            if "norm" in pname:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        model.apply(reinit_buffers)

    def random_weights(site: Any) -> Any:
        gu_shape, dn_shape = shapes[id(site.module)]

        def make(ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
            gu = torch.empty((len(ids), *gu_shape[1:]), dtype=dtype, device=fast).normal_(0, 0.02, generator=gen)
            dn = torch.empty((len(ids), *dn_shape[1:]), dtype=dtype, device=fast).normal_(0, 0.02, generator=gen)
            return gu, dn

        return make, gu_shape, dn_shape

    return model, sites, random_weights


def reinit_buffers(module: torch.nn.Module) -> None:
    """Buffers made on the meta device (rotary `inv_freq`) hold garbage after `to_empty`: recompute them."""
    if not (hasattr(module, "inv_freq") and hasattr(module, "rope_type")):
        return
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    init = (
        module.compute_default_rope_parameters
        if module.rope_type == "default"
        else ROPE_INIT_FUNCTIONS[module.rope_type]
    )
    inv_freq, _ = init(module.config)
    module.inv_freq.copy_(inv_freq)
    if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
        module.original_inv_freq.copy_(inv_freq)
