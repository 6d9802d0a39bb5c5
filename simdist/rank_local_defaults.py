"""Process-wide state of torch and Megatron-core that is rank-local without asking.

Third-party code keeps some state once per process. On a cluster every rank has
its own copy; in simdist the rank threads share one, so such state is swapped at
every token switch (see ``rank_state``), exactly like ``rank_local=`` entries,
but without the user having to know it exists. Only state that makes real,
unmodified code fail or give wrong results when shared is listed here:

* DTensor's op dispatcher keeps a dict of custom op handlers on a class
  attribute (``DTensor._op_dispatcher._custom_op_handlers``). ``loss_parallel()``
  adds the loss ops to it on entry and pops them on exit: with shared state the
  first rank to leave removes them from under its peers (their backward then
  runs without the handlers) and the second one's exit fails with
  ``KeyError: aten._log_softmax.default``. Each rank gets its own contents; the
  dict object stays the same (torch's C++ dispatch reads it).
* DTensor's random-op tracker (``torch.distributed.tensor._random._rng_tracker``)
  is created by a process's first random op on a DTensor and holds that
  process's generator offsets.
* Megatron-core keeps its process groups, ranks and buffers in the module globals
  of ``megatron.core.parallel_state``: ``initialize_model_parallel`` on a
  second rank fails with "... is already initialized", and every getter would
  return the last rank's groups. ``megatron.core.tensor_parallel.random`` keeps
  the model-parallel RNG tracker (per-rank seeds) in module globals too.

A library counts only when the process has already imported it when the run
starts (importing Megatron costs seconds; a process that never did cannot hold
its state). A module first imported by a rank during a run is shared, as
before: import it before ``simdist.run``, or name it in ``rank_local=``.
"""

from __future__ import annotations

import sys
from typing import Any

from .rank_state import _Slot, _attr_slot, _module_slot, attr_slot_name

# Megatron-core modules whose globals are process state (see the module doc).
MEGATRON_MODULES = ("megatron.core.parallel_state", "megatron.core.tensor_parallel.random")


def _dtensor_handlers_slot(dispatcher: Any) -> _Slot:
    """The custom-handler dict's contents, per rank, restored in place."""
    attr = "_custom_op_handlers"

    def get() -> tuple[dict, dict]:
        table = getattr(dispatcher, attr)
        return table, dict(table)

    def set_(value: tuple[dict, dict]) -> None:
        table, contents = value
        # Context parallelism rebinds the attribute for a while; put back the
        # dict this rank had, then its contents.
        if getattr(dispatcher, attr) is not table:
            setattr(dispatcher, attr, table)
        if table != contents:
            table.clear()
            table.update(contents)

    def copy_(value: tuple[dict, dict]) -> tuple[dict, dict]:
        return value  # a snapshot nobody mutates (handlers are functions: shared, like code)

    def fingerprint() -> Any:
        # Keys and handlers compare by identity, so this costs about a microsecond.
        table = getattr(dispatcher, attr)
        return table, tuple(table.items())

    return _Slot(attr_slot_name(type(dispatcher), attr), get, set_, copy_, fingerprint)


def default_slots(taken: set[str]) -> list[_Slot]:
    """Slots for the default rank-local state the process holds now, leaving
    out any the caller already listed in ``rank_local`` (names in ``taken``)."""
    slots: list[_Slot] = []
    api = sys.modules.get("torch.distributed.tensor._api")
    if api is not None and hasattr(api, "DTensor"):
        dispatcher = api.DTensor._op_dispatcher
        if isinstance(getattr(dispatcher, "_custom_op_handlers", None), dict):
            slots.append(_dtensor_handlers_slot(dispatcher))
    tracker_module = sys.modules.get("torch.distributed.tensor._random")
    if tracker_module is not None and hasattr(tracker_module, "_rng_tracker"):
        slots.append(_attr_slot(tracker_module, "_rng_tracker"))
    for name in MEGATRON_MODULES:
        module = sys.modules.get(name)
        # A module still being imported (partly initialised) is left alone.
        if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
            slots.append(_module_slot(module))
    return [s for s in slots if s.name not in taken]
