#!/usr/bin/env python3
"""Start JetStream's own mock server (google-jetstream 0.2.2) on loopback, sized for a small CPU.

    python scripts/jetstream_mock_server.py --port 9000 [--host 127.0.0.1] [--fake-work-size 64]

This runs JetStream's real gRPC server, orchestrator and mock engine (`jetstream.core.server_lib.run`
with `config_lib.InterleavedCPUTestServer`), as `jetstream/core/implementations/mock/server.py` does, with
three workarounds applied before the server starts (see docs/servers.md, "JetStream's own server"):

- Bind address: `server_lib._HOST` is "[::]" (all interfaces) with no flag; it is set to `--host`.
- Fake work: the mock engine multiplies two 4096x4096 matrices in every prefill and generate step
  (~137 GFLOP, seconds per step on 2 CPU cores); the literal is replaced with `--fake-work-size`
  in the two functions' code before jax traces them. Everything else in the engine is unchanged.
- seqio: JetStream imports `seqio.vocabularies` only for a base class (the mock's TestVocab) and
  for SentencePieceVocabulary (real checkpoints); seqio pulls TensorFlow (~2.5 GB). Where seqio is
  not installed, a minimal `seqio.vocabularies` stands in; the mock engine's vocabulary is "test",
  so SentencePiece is never loaded. With seqio installed, the real one is used.

Limits of the mock (JetStream's, not ours): its chr()/ord() vocabulary makes every prompt
character a token, and prefill keeps the last 32 (BOS included; longer prompts are cut, with a
warning in the log). Each generated id is 2 x the prompt's id sum plus half the ids so far (~1.5x
per step), so after ~14-20 tokens from a text prompt an id is past chr()'s range: the detokenize
thread raises and JetStream SIGKILLs its own process. Prompts sent as token ids are not detokenized.
jax must be 0.4.x (0.4.38 tested): the orchestrator calls jax.tree_map, removed in jax 0.6.
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Callable
from typing import Any

REAL_FAKE_SIZE = 4096  # the literal in jetstream/engine/mock_engine.py (0.2.2)


def stand_in_seqio() -> None:
    """Register a minimal seqio.vocabularies where seqio is missing (see the module docstring)."""
    try:
        import seqio.vocabularies  # noqa: F401
        return
    except ImportError:
        pass

    class Vocabulary:  # the base TestVocab subclasses; TestVocab defines everything the mock uses
        def __init__(self, extra_ids: int = 0) -> None:
            self._extra_ids = extra_ids

    class SentencePieceVocabulary(Vocabulary):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("a SentencePiece vocabulary needs the real seqio (pip install seqio); "
                               "this launcher serves only the mock engine")

    vocabularies = types.ModuleType("seqio.vocabularies")
    vocabularies.Vocabulary = Vocabulary  # type: ignore[attr-defined]
    vocabularies.SentencePieceVocabulary = SentencePieceVocabulary  # type: ignore[attr-defined]
    package = types.ModuleType("seqio")
    package.vocabularies = vocabularies  # type: ignore[attr-defined]
    sys.modules.update({"seqio": package, "seqio.vocabularies": vocabularies})


def shrink_fake_work(engine_class: type, size: int) -> list[str]:
    """Replace the 4096 fake-work literal in the engine's jitted prefill/generate; return their names."""
    patched = []
    for name in ("prefill", "generate"):
        fn: Callable[..., Any] = getattr(getattr(engine_class, name), "__wrapped__", None)  # under jax.jit
        code = getattr(fn, "__code__", None)
        if code is None or REAL_FAKE_SIZE not in code.co_consts:
            raise SystemExit(f"jetstream_mock_server: TestEngine.{name} has no {REAL_FAKE_SIZE} fake-work literal "
                             "(a google-jetstream other than 0.2.2?); pass --fake-work-size=0 to leave it as is")
        fn.__code__ = code.replace(co_consts=tuple(size if c == REAL_FAKE_SIZE else c for c in code.co_consts))
        patched.append(name)
    return patched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (JetStream's own default is [::])")
    # JetStream's mock server.py defaults to the interleaved config too. Its other one, CPUTestServer, cannot
    # start on a CPU: it wants two devices (a "cpu=1" slice each for prefill and generate), while each mock
    # engine builds a (1, 1, 1) mesh from all of jax.devices(), so two host devices fail it as well.
    parser.add_argument("--config", default="InterleavedCPUTestServer", choices=("InterleavedCPUTestServer",))
    parser.add_argument("--fake-work-size", type=int, default=64,
                        help=f"side of the mock engine's per-step matmul (JetStream's: {REAL_FAKE_SIZE}; 0 keeps it)")
    args = parser.parse_args(argv)

    if args.fake_work_size < 0:
        parser.error(f"--fake-work-size={args.fake_work_size}: give a side length >= 1, or 0 to keep JetStream's")
    stand_in_seqio()
    try:
        import jax

        if not jax.__version__.startswith("0.4."):
            raise SystemExit(f"jetstream_mock_server: jax {jax.__version__} is installed; JetStream 0.2.2's "
                             "orchestrator calls jax.tree_map, removed in jax 0.6: "
                             "pip install jax==0.4.38 jaxlib==0.4.38")
        from jetstream.core import server_lib
        from jetstream.core.implementations.mock import config as mock_config
        from jetstream.engine import mock_engine
    except ImportError as exc:
        raise SystemExit(f"jetstream_mock_server: {exc}. It needs JetStream's server code: tox -e jetstream builds it "
                         "(tox.ini's [testenv:jetstream] lists the packages)") from exc

    server_lib._HOST = args.host  # read when the server adds its port, so set before run()
    if args.fake_work_size:
        shrink_fake_work(mock_engine.TestEngine, args.fake_work_size)
    server = server_lib.run(port=args.port, config=mock_config.get_server_config(args.config),
                            devices=server_lib.get_devices())
    print(f"jetstream_mock_server: {args.config} serving on {args.host}:{args.port} "
          f"(fake work {args.fake_work_size or REAL_FAKE_SIZE}^2)", file=sys.stderr, flush=True)
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
