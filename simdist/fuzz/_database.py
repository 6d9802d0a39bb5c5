"""Where a campaign keeps Hypothesis' example database.

A plain path is a local ``DirectoryBasedExampleDatabase`` (shared by every
worker process of a campaign and by later campaigns on the same machine).
``python:package.module:name`` names an ``ExampleDatabase`` object, class or
factory of the user's, which is how campaigns share one database between
machines (``GitHubArtifactDatabase``, ``RedisExampleDatabase`` from
``hypothesis[redis]``, wrapped in a ``MultiplexedDatabase``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

__all__ = ["DatabaseSpecError", "GuardedDatabase", "resolve_database"]


class DatabaseSpecError(ValueError):
    pass


def resolve_database(spec: str | None) -> ExampleDatabase | None:
    if spec is None or spec.lower() == "none":
        return None
    if spec.startswith("python:"):
        target = spec[len("python:") :]
        module_name, _, attr = target.partition(":")
        if not module_name or not attr:
            raise DatabaseSpecError(
                f"--database {spec!r}: expected python:package.module:name, e.g. python:ci_db:database"
            )
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise DatabaseSpecError(f"--database {spec!r}: cannot load {target}: {exc}") from exc
        if isinstance(obj, ExampleDatabase):
            return obj
        if callable(obj):
            try:
                made = obj()
            except Exception as exc:  # the user's factory: its own error, named as the option's
                raise DatabaseSpecError(
                    f"--database {spec!r}: calling {module_name}.{attr}() to make the database raised "
                    f"{type(exc).__name__}: {exc} (it must take no arguments and return an ExampleDatabase)"
                ) from exc
            if isinstance(made, ExampleDatabase):
                return made
            raise DatabaseSpecError(
                f"--database {spec!r}: {target}() returned {type(made).__name__}, not a hypothesis ExampleDatabase"
            )
        raise DatabaseSpecError(
            f"--database {spec!r}: {target} is {type(obj).__name__}, not an ExampleDatabase"
        )
    return DirectoryBasedExampleDatabase(str(Path(spec)))


class GuardedDatabase(ExampleDatabase):
    """The campaign's database, with the first error it raised kept.

    Hypothesis calls the database from inside a property's run (reusing known
    failures, saving new ones); an error there (a Redis server down, a full
    disk) would reach the campaign as the property failing. The worker asks
    ``take_error`` after a failed round: an error here is the environment's,
    reported as such, never as the property's.
    """

    def __init__(self, inner: ExampleDatabase, spec: str) -> None:
        super().__init__()
        self.inner = inner
        self.spec = spec  # as the user gave it (--database)
        self.error: BaseException | None = None

    def _guard(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except Exception as exc:
            if self.error is None:
                self.error = exc
            raise

    def save(self, key: bytes, value: bytes) -> None:
        self._guard(self.inner.save, key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        # A generator's errors come while Hypothesis iterates: read it all here.
        return self._guard(lambda: list(self.inner.fetch(key)))

    def delete(self, key: bytes, value: bytes) -> None:
        self._guard(self.inner.delete, key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self._guard(self.inner.move, src, dest, value)

    def take_error(self) -> BaseException | None:
        error, self.error = self.error, None
        return error

    def __repr__(self) -> str:
        return repr(self.inner)
