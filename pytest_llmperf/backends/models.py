"""Embedded default models: causal LMs built from configs with random weights, never downloaded.

Timing depends on shapes, not weights, so a model made from a config with a fixed seed measures the
same as the real one. Each is written once to the cache folder (`save_pretrained`) and loaded with
`from_pretrained(path)` after that. The tokenizer is a word-level `tokenizers` model over a fixed
synthetic vocabulary, so a prompt of N words is N tokens and nothing needs the network.

The `tiny-*` models (~20M parameters) are for the cpu target; the seed-sized shapes
(`bloomz-7b1-mt`, `llama-2-7b`, `mixtral-8x7b`) are for GPU targets, built on the GPU in bf16.
Users pass their own local model directories instead with `--llmperf-model NAME=PATH`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..measure.scenario import PROMPT_TEXT, make_prompt  # noqa: F401  (make_prompt: the models' prompts)

BUILDER_VERSION = 1
VOCAB_SIZE = 16384
SEED = 0

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")


def _vocabulary(size: int) -> list[str]:
    """Special tokens, the prompt's words, then deterministic pseudo-words up to `size`."""
    vocab = list(SPECIAL_TOKENS)
    seen = set(vocab)
    for word in PROMPT_TEXT.split():
        if word not in seen:
            seen.add(word)
            vocab.append(word)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    for n in itertools.count(2):
        for parts in itertools.product(syllables, repeat=n):
            word = "".join(parts)
            if word not in seen:
                seen.add(word)
                vocab.append(word)
                if len(vocab) == size:
                    return vocab
    raise AssertionError("unreachable: itertools.count never ends")


def _tiny_bloom() -> Any:
    from transformers import BloomConfig

    return BloomConfig(vocab_size=VOCAB_SIZE, hidden_size=384, n_layer=6, n_head=6)


def _tiny_llama() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )


def _tiny_mixtral() -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=4096,
    )


def _bloomz_7b1() -> Any:
    from transformers import BloomConfig

    return BloomConfig(vocab_size=250880, hidden_size=4096, n_layer=30, n_head=32)


def _llama_2_7b() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
    )


def _mixtral_8x7b() -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=32768,
    )


EMBEDDED: Mapping[str, Callable[[], Any]] = {
    "tiny-bloom": _tiny_bloom,
    "tiny-llama": _tiny_llama,
    "tiny-mixtral": _tiny_mixtral,
    "bloomz-7b1-mt": _bloomz_7b1,
    "llama-2-7b": _llama_2_7b,
    "mixtral-8x7b": _mixtral_8x7b,
}
#: Embedded models small enough to build in fp32 on a CPU.
CPU_SIZED = ("tiny-bloom", "tiny-llama", "tiny-mixtral")


class ModelError(ValueError):
    """A model name that is neither embedded, mapped to a path, nor an existing directory."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-llmperf"


def resolve_model(
    name: str, *, local_models: Mapping[str, str], cache_dir: Path | None, build_device: str = "cpu"
) -> Path:
    """The local directory to load `name` from: a mapped path, an embedded model, or a directory."""
    if name in local_models:
        path = Path(local_models[name]).expanduser()
        if not path.is_dir():
            raise ModelError(f"--llmperf-model {name}={local_models[name]}: no such directory")
        return path
    if name in EMBEDDED:
        return build_embedded(name, cache_dir or default_cache_dir(), device=build_device)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    raise ModelError(
        f"unknown model {name!r}: not an embedded model ({', '.join(EMBEDDED)}) nor a local directory. "
        f"Pass a local path, or map the name with --llmperf-model {name}=/path/to/model"
    )


def _config_digest(name: str) -> str:
    config = EMBEDDED[name]().to_json_string(use_diff=False)
    blob = json.dumps({"config": config, "builder": BUILDER_VERSION, "vocab": VOCAB_SIZE, "seed": SEED})
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_embedded(name: str, cache_dir: Path, *, device: str = "cpu") -> Path:
    """Build embedded model `name` once into `cache_dir` and return its directory.

    The directory is written under a temporary name and renamed into place, so a crash or a
    concurrent build never leaves a half-written model behind.
    """
    target = Path(cache_dir) / "models" / f"{name}-{_config_digest(name)}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        _write_model(name, staging, device)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_model(name: str, path: Path, device: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config = EMBEDDED[name]()
    torch.manual_seed(SEED)
    dtype = torch.float32 if name in CPU_SIZED else torch.bfloat16
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(path)
    tokenizer_for(config.vocab_size).save_pretrained(path)


def tokenizer_for(vocab_size: int) -> Any:
    """The offline word-level tokenizer, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = _vocabulary(min(vocab_size, VOCAB_SIZE))
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
