"""A communicator's structured identity: its c10d name, members, axes and run.

Faults, the flight recorder and CommStats select groups by axis; they read
``axes`` here instead of parsing the label text back.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._core.records import GroupInfo


def axes_of(label: str) -> tuple[str, ...]:
    """The axes a label names: "dp/dp_cp" -> ("dp", "dp_cp"); "world" -> ("world",);
    a group made by ``new_group`` without a description ("group 3") names none."""
    if label.startswith("group "):
        return ()
    return tuple(label.split("/"))


@dataclass(eq=False)
class SimGroup(GroupInfo):
    """One communicator of one run, shared by its members' group objects.

    ``label`` is what reports print ("dp/dp_cp"); ``axes`` the names it answers
    to as data. Both are refined once c10d tells a group its description.
    """

    run: str = ""
    axes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.axes:
            self.axes = axes_of(self.label)

    def relabel(self, label: str) -> None:
        self.label = label
        self.axes = axes_of(label)

    def answers_to(self, selector: str) -> bool:
        """Whether a selector ("dp", "world", or a whole label) names this group."""
        return selector == self.label or selector in self.axes
