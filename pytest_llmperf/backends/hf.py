"""In-process Hugging Face transformers backend.

One run: tokenize the batch, one forward over it (prefill), then `decode_length - 1` forwards of
one token each over the KV cache (decode), then detokenize. Greedy argmax, no early stop, so the
tokens equal `model.generate(max_new_tokens=decode_length, min_new_tokens=decode_length,
do_sample=False)` (tested). On CUDA the clock synchronizes the device before each reading.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from ..measure.backend import Backend, BackendError, Clock, GenerationRequest, OutOfMemory, synchronized_clock
from ..measure.records import RunSample

DTYPES = ("fp32", "fp16", "bf16", "int8")


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "not enough memory" in text or "can't allocate memory" in text


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def cuda_missing(origin: str, torch: Any) -> str:
    """One line for a CUDA device on a machine where torch sees none; `origin` says who asked for it."""
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (
        f"{origin}, but torch {torch.__version__} ({build}) sees no CUDA device on this machine. Run it on the "
        f"GPU machine, or measure the cpu target: --llmperf-device=cpu"
    )


class HFBackend(Backend):
    kind = "hf"
    splits_prefill: ClassVar[bool] = True
    clocked_in_process: ClassVar[bool] = True
    knob_names: ClassVar[tuple[str, ...]] = ("threads", "tokenizers_parallelism")

    def __init__(
        self,
        model_path: str | Path,
        *,
        name: str | None = None,
        dtype: str = "fp32",
        device: str = "cpu",
        clock: Clock | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
    ):
        if dtype not in DTYPES:
            raise BackendError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.name = name or str(model_path)
        self.model_path = Path(model_path)
        self.dtype = dtype
        self.device = device
        kwargs: dict[str, Any] = {"local_files_only": True, **(model_kwargs or {})}
        if dtype == "int8":
            try:
                import bitsandbytes  # noqa: F401
                from transformers import BitsAndBytesConfig
            except ImportError:
                raise BackendError("dtype int8 needs bitsandbytes: pip install bitsandbytes") from None
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
            kwargs["device_map"] = device
        else:
            kwargs["dtype"] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendError(cuda_missing(f"device {device!r} needs CUDA", torch))
        try:  # transformers says ValueError for a directory without a tokenizer: one line with the fix instead
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise BackendError(
                f"cannot load a tokenizer from {self.model_path} ({_first_line(exc)}): the model directory needs "
                f"its tokenizer files (tokenizer.json or tokenizer_config.json with its vocabulary); save them "
                f"there with tokenizer.save_pretrained('{self.model_path}')"
            ) from None
        try:
            model = AutoModelForCausalLM.from_pretrained(self.model_path, **kwargs)
        except (OSError, ValueError) as exc:
            raise BackendError(
                f"cannot load the model from {self.model_path} ({_first_line(exc)}): the directory needs "
                f"config.json and the weights (model.save_pretrained('{self.model_path}'))"
            ) from None
        self.model = (model if dtype == "int8" else model.to(device)).eval()
        # generate() computes only the last position's logits at prefill; so do we, where supported.
        params = inspect.signature(self.model.forward).parameters
        self._prefill_kwargs = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # The KV cache by the name this transformers gives it: `cache` from 5.24 (where `past_key_values` warns, and
        # goes in 5.40), `past_key_values` before.
        self._cache = "cache" if "cache" in params else "past_key_values"
        if device.startswith("cuda"):
            clock = (
                synchronized_clock(torch.cuda.synchronize, clock)
                if clock
                else synchronized_clock(torch.cuda.synchronize)
            )
        super().__init__(clock)

    # -- measurement ---------------------------------------------------------------------------

    def _token_ids(self, request: GenerationRequest) -> Any:
        ids = self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
        if not ids:
            raise BackendError("the prompt tokenized to nothing")
        while len(ids) < request.sequence_length:  # exact length, whatever the tokenizer
            ids = ids + ids
        row = self.torch.tensor([ids[: request.sequence_length]], device=self.device)
        return row.expand(request.batch_size, -1).contiguous()

    def generate(self, request: GenerationRequest) -> RunSample:
        try:
            return self._generate(request)
        except Exception as exc:
            if _is_oom(exc):
                self._release_memory()
                raise OutOfMemory(f"out of memory at batch size {request.batch_size}: {exc}") from exc
            raise

    def _generate(self, request: GenerationRequest) -> RunSample:
        torch, model, clock = self.torch, self.model, self.clock
        start = clock()
        input_ids = self._token_ids(request)
        tokenized = clock()
        times: list[int] = []
        with torch.inference_mode():
            out = model(input_ids=input_ids, use_cache=True, **self._prefill_kwargs)
            token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            times.append(clock())
            cache = self._cache
            past = getattr(out, cache)
            tokens = [token]
            for _ in range(request.decode_length - 1):
                out = model(input_ids=token, use_cache=True, **{cache: past})
                past = getattr(out, cache)
                token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                tokens.append(token)
                times.append(clock())
        generated = torch.cat(tokens, dim=1)
        decode_start = clock()
        self.last_texts = self.tokenizer.batch_decode(generated.tolist(), skip_special_tokens=True)
        end = clock()
        self.last_tokens = generated
        rel = [t - start for t in times]
        return RunSample(
            batch_size=request.batch_size,
            token_times_ns=[list(rel) for _ in range(request.batch_size)],
            end_to_end_ns=times[-1] - start,
            tokenize_ns=tokenized - start,
            prefill_ns=times[0] - tokenized,
            decode_steps_ns=[b - a for a, b in itertools.pairwise(times)],
            detokenize_ns=end - decode_start,
            generated_tokens=int(generated.numel()),
            output_ids=generated.tolist(),
            output_texts=list(self.last_texts),
        )

    def reference_generate(self, request: GenerationRequest) -> Any:
        """`model.generate` on the same input, greedy, fixed length: the tokens our loop must equal."""
        with self.torch.inference_mode():
            ids = self._token_ids(request)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=self.torch.ones_like(ids),
                max_new_tokens=request.decode_length,
                min_new_tokens=request.decode_length,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        return out[:, ids.shape[1] :]

    def _release_memory(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()

    # -- lifecycle and description --------------------------------------------------------------

    @contextlib.contextmanager
    def apply_knobs(self, knobs: Mapping[str, Any]) -> Iterator[None]:
        with super().apply_knobs(knobs):
            old_threads = self.torch.get_num_threads()
            old_env = os.environ.get("TOKENIZERS_PARALLELISM")
            try:
                if "threads" in knobs:
                    self.torch.set_num_threads(int(knobs["threads"]))
                if "tokenizers_parallelism" in knobs:
                    value = knobs["tokenizers_parallelism"]
                    os.environ["TOKENIZERS_PARALLELISM"] = "true" if value in (True, "true", "1") else "false"
                yield
            finally:
                self.torch.set_num_threads(old_threads)
                if old_env is None:
                    os.environ.pop("TOKENIZERS_PARALLELISM", None)
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = old_env

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.kind,
            "model": self.name,
            "model_path": str(self.model_path),
            "architecture": type(self.model).__name__,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "dtype": self.dtype,
            "device": self.device,
            "threads": self.torch.get_num_threads(),
        }

    def close(self) -> None:
        if getattr(self, "model", None) is None:
            return
        self.model = None
        self._release_memory()
