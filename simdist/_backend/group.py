"""A communicator's identity: its c10d name, members and axes, and what
a rank's group object answers c10d about itself.

Faults, the flight recorder and CommStats select groups by axis; they read
``axes`` here instead of parsing the label text back. ``GroupIdentity`` is
the group object's names, backend name, options and timeouts, as c10d's
binding and the code reading a ProcessGroup ask for them.
"""

from __future__ import annotations

import types
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupName

from .._core.records import GroupInfo
from .._isolation.c10d_state import scoped_name
from .world_hooks import WorldHooks

BACKEND_NAME = "simdist"

# SimProcessGroup's mixins (here and ``p2p``) are type-checked as the
# ProcessGroup they are mixed into; at run time each is a plain class (c10d's
# pybind base is SimProcessGroup's own, once).
if TYPE_CHECKING:
    MixinBase = dist.ProcessGroup
else:
    MixinBase = object


class SimGroup(GroupInfo):
    """One communicator of one run, shared by its members' group objects.

    ``label`` is what reports print ("dp/dp_cp"), refined once c10d tells a
    group its description; ``axes`` the names it answers to as data.
    """

    @property
    def axes(self) -> tuple[str, ...]:
        """The axes the label names: "dp/dp_cp" -> ("dp", "dp_cp"); "world" -> ("world",);
        a group made by ``new_group`` without a description ("group 3") names none."""
        if self.label.startswith("group "):
            return ()
        return tuple(self.label.split("/"))

    def relabel(self, label: str) -> None:
        self.label = label


class GroupIdentity(MixinBase):
    """``SimProcessGroup``'s names, backend name, options and timeouts."""

    _world: WorldHooks
    _info: GroupInfo
    _name: GroupName
    _desc: str
    _backend_name: str
    timeout: float | None

    # c10d stores names in the C++ backend, which a Python group does not have.
    # The name c10d resolves groups by (functional collectives, DTensor) is
    # unique to this run and rank; see c10d_state.
    def _set_group_name(self, name: str) -> None:
        self._name = GroupName(scoped_name(name))

    @property
    def group_name(self) -> GroupName:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc
        if desc and desc not in ("undefined", "default_pg"):
            self._world.label_group(self._info.name, desc)

    @property
    def group_desc(self) -> str:
        return self._desc

    # c10d's C++ side (DDP's logger) reads getBackendName() and, for "gloo",
    # looks up a gloo backend this group does not have: it keeps the true
    # name. Python code reads _get_backend_name(): the name the program asked for.
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return self._backend_name

    def name(self) -> str:
        """``pg.name()`` as c10d answers it: the backend asked for ("gloo"),
        or "custom" for a group asked for as simdist (a registered backend)."""
        return "custom" if self._backend_name == BACKEND_NAME else self._backend_name

    def _get_backend(self, device: Any) -> GroupIdentity:  # type: ignore[override]  # c10d's stub returns its Backend type
        """c10d's backend for a device: a simdist group serves every device itself."""
        return self

    @staticmethod
    def create_device(hostname: str = "", interface: str = "", lazy_init: bool | None = None) -> Any:
        """gloo's ``create_device``, which code calls on the backend of a
        gloo group: torch's own (simdist's transport needs no device)."""
        kwargs: dict[str, Any] = {"hostname": hostname, "interface": interface}
        if lazy_init is not None:
            kwargs["lazy_init"] = lazy_init
        return dist.ProcessGroupGloo.create_device(**kwargs)

    def model_timeout(self, seconds: float) -> None:
        """The group was made with an explicit ``timeout=``: its waits time out as
        gloo's do, the moment they can never complete (see ``timeouts``)."""
        self.timeout = seconds
        self.options._timeout = timedelta(seconds=seconds)

    def set_timeout(self, timeout: timedelta) -> None:
        """c10d's ``pg.set_timeout`` (and ``_set_default_timeout``): the group's later waits time out after it."""
        self.model_timeout(timeout.total_seconds())

    _set_default_timeout = set_timeout

    @property
    def options(self) -> Any:
        opts = self.__dict__.get("options")
        if opts is None:
            # gloo's options object, as a gloo backend's ``options`` holds it
            # (its ``_timeout`` is the group's); a plain namespace without gloo.
            kind = getattr(dist, "ProcessGroupGloo", None)
            opts = kind._Options() if kind is not None else types.SimpleNamespace()
            opts._timeout = dist.distributed_c10d.default_pg_timeout
            self.__dict__["options"] = opts
        return opts

    @options.setter
    def options(self, value: Any) -> None:
        self.__dict__["options"] = value

    def report_backend_as(self, name: str) -> None:
        """The backend name the program asked for ("gloo"), reported instead of "simdist"."""
        self._backend_name = name
        if name.lower() == "nccl":
            self.asked_for_nccl()

    def asked_for_nccl(self) -> None:
        """The program asked for NCCL: the sanitizer holds the group to NCCL's ordering rule."""
        self._info.nccl = True
