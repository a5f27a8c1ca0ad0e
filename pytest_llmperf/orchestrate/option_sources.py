"""One option: its CLI flag `--llmperf-X`, ini key `llmperf_X` and environment variable `LLMPERF_X`, where its value
comes from (CLI > environment > ini > default, as pytest-timeout does) and how it is parsed. The table of every
option is the Settings dataclass (options.py): each of its fields is declared with `option(...)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

#: The key of a Settings field's metadata that holds its Option.
OPTION = "llmperf_option"


@dataclass(frozen=True)
class Option:
    name: str  # e.g. "runs" -> --llmperf-runs, llmperf_runs, LLMPERF_RUNS
    help: str
    parse: Callable[[Any], Any]
    default: Any = None
    ini_type: str = "string"
    flag: bool = False  # a CLI switch (store_true)
    repeatable: bool = False  # a CLI option given several times
    metavar: str | None = None
    empty_given: bool = False  # an empty environment variable or ini value is a value to parse, not "unset"

    @property
    def cli(self) -> str:
        return "--llmperf-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "llmperf_" + self.name

    @property
    def env(self) -> str:
        return "LLMPERF_" + self.name.upper()

    @property
    def dest(self) -> str:
        return "llmperf_" + self.name

    def add_to(self, parser: pytest.Parser, group: pytest.OptionGroup) -> None:
        help_text = f"{self.help} (ini: {self.ini}, env: {self.env})"
        if self.flag:
            group.addoption(self.cli, action="store_true", default=None, dest=self.dest, help=help_text)
        elif self.repeatable:
            group.addoption(
                self.cli, action="append", default=None, dest=self.dest, metavar=self.metavar, help=help_text
            )
        else:
            group.addoption(
                self.cli, action="store", default=None, dest=self.dest, metavar=self.metavar, help=help_text
            )
        parser.addini(self.ini, help=self.help, type=self.ini_type, default=None)  # type: ignore[arg-type]

    def value(self, config: pytest.Config) -> Any:
        """CLI > environment > ini > default; a bad value is a UsageError naming where it came from."""
        for _, label, raw in self._sources(config):
            try:
                return self.parse(raw)
            except (TypeError, ValueError) as exc:
                raise pytest.UsageError(f"llmperf: bad value for {label}: {exc}") from None
        return self.default

    def source(self, config: pytest.Config) -> str | None:
        """Where the value comes from: 'cli', 'env', 'ini', or None for the default."""
        found = self._sources(config)
        return found[0][0] if found else None

    def _sources(self, config: pytest.Config) -> list[tuple[str, str, Any]]:
        found: list[tuple[str, str, Any]] = []
        cli = config.getoption(self.dest, default=None)
        if cli is not None:
            found.append(("cli", self.cli, cli))
        env = os.environ.get(self.env)
        if env is not None and (env != "" or self.empty_given):
            found.append(("env", f"environment variable {self.env}", env))
        try:
            ini = config.getini(self.ini)
        except ValueError as exc:  # pytest's own conversion (bool ini type): name the option
            raise pytest.UsageError(
                f"llmperf: bad value for ini option {self.ini} in {config.inipath or 'the config file'}: {exc}"
            ) from None
        if ini is not None and ini != [] and (ini != "" or self.empty_given):
            found.append(("ini", f"ini option {self.ini} in {config.inipath or 'the config file'}", ini))
        return found


def option(
    help: str,
    parse: Callable[[Any], Any],
    default: Any = None,
    *,
    ini_type: str = "string",
    flag: bool = False,
    repeatable: bool = False,
    metavar: str | None = None,
    empty_given: bool = False,
) -> Any:
    """A Settings field that is an option (named after the field): its help, parser, default and CLI form."""
    spec = Option("", help, parse, default, ini_type, flag, repeatable, metavar, empty_given)
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={OPTION: spec})
    return field(default=default, metadata={OPTION: spec})
