"""The registry of known differences between simdist and gloo.

The differential property reports only differences that no entry here
explains. Every entry says why the difference exists and names the test that
pins it (``test_known_differences.py``: the minimal program still shows the
difference exactly as described, so an entry whose difference was fixed
fails its pin and is removed). ``pending`` names the branch expected to remove
the entry by fixing simdist; entries without it are documented, intended
differences (docs/differences.md, whose table tests/docs/test_differences_table.py keeps in step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from diff_compare import Difference
from diff_program import Program


@dataclass(frozen=True)
class Known:
    name: str
    reason: str
    example: dict[str, Any]  # the minimal program that shows it (Program.to_json form)
    matches: Callable[[Program, dict[str, Any], Difference], bool]
    pending: str | None = None  # the helper/branch fixing it; None: documented difference
    # gloo shows some differences only when its worker threads lose a race: the
    # pin runs the program up to this many times and needs the difference once.
    tries: int = 1
    # Explained only after a call both worlds refused, earlier in the program (``explain`` is given the program's differences).
    after_refusal: bool = False

    @property
    def pinned_by(self) -> str:
        return f"tests/differential/test_known_differences.py::test_pinned[{self.name}]"

    def program(self) -> Program:
        return Program.from_json(self.example)


# gloo moves the version counter of these ops' outputs (torch 2.13); simdist moves none.
VERSION_BUMPING = (
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "all_to_all",
)


NON_CONTIGUOUS = ("strided", "transposed")
# gloo hands these ops' tensors to its C++ side as if they were contiguous.
WRITTEN_AS_CONTIGUOUS = (
    "all_reduce",
    "reduce",
    "broadcast",
    "scatter",
    "reduce_scatter",
    "all_to_all_single",
)


def _non_contiguous_written_as_contiguous(program: Program, s: dict[str, Any], d: Difference) -> bool:
    return (
        s["op"] in WRITTEN_AS_CONTIGUOUS
        and s["view"] in NON_CONTIGUOUS
        and d.aspect == "status"
        and "must be contiguous" in d.simdist
    )


def _non_contiguous_into_tensor(program: Program, s: dict[str, Any], d: Difference) -> bool:
    return (
        s["op"] in ("all_gather_into_tensor", "reduce_scatter_tensor")
        and s["view"] in NON_CONTIGUOUS
        and d.aspect == "status"
        and "must be contiguous" in d.simdist
    )


def _completes_without_a_member(program: Program, s: dict[str, Any], d: Difference) -> bool:
    """A member never makes a call (it skipped it, or it is stuck at an earlier
    step in both worlds): on gloo, members that need nothing from it return (a
    broadcast receiver, any member when the tensors are empty); simdist's
    members all wait for the missing one."""
    if d.aspect != "status" or d.gloo != "ok" or "hang" not in d.simdist:
        return False
    if s["skip"]:
        return True
    return bool(d.absent) and (0 in s["shape"] or s["op"] == "broadcast")


def _stacked_all_gather_into_tensor(program: Program, s: dict[str, Any], d: Difference) -> bool:
    return (
        s["op"] == "all_gather_into_tensor"
        and (s["stack"] or s["shape"] == [])
        and d.aspect == "status"
        and "invalid tensor size" in d.gloo
    )


def _stacked_reduce_scatter_tensor(program: Program, s: dict[str, Any], d: Difference) -> bool:
    if s["op"] != "reduce_scatter_tensor" or d.aspect != "status":
        return False
    if s["shape"] == [] and "the gloo process died" in d.gloo:
        # gloo's SIGSEGV on a 0-dim output: whatever simdist made of the call
        # (computed it, or an earlier known difference left it waiting).
        return True
    return bool(s["stack"] or s["shape"] == []) and d.gloo.startswith("error") and d.simdist == "ok"


def _work_result(program: Program, s: dict[str, Any], d: Difference) -> bool:
    return d.aspect == "result_aliases"


def _barrier_rethrows_refused_async(program: Program, s: dict[str, Any], d: Difference) -> bool:
    """gloo refuses a bad async call at its wait, not at its issue; a barrier
    issued while that failed Work is still queued or running on gloo's worker
    threads waits for it and raises its error, and a member whose barrier did
    not see the Work then waits for the one that raised. simdist refuses the
    call at its issue (nothing is left in flight), so its barrier completes."""
    if s["op"] != "barrier" or d.aspect != "status" or d.simdist != "ok":
        return False
    if not d.gloo.startswith(("error", "hang")):
        return False
    return any(step["async"] and step["op"] != "barrier" for step in program.steps[: d.index])


def _mismatch_detected(program: Program, s: dict[str, Any], d: Difference) -> bool:
    """Members reached different calls (a skipped step): gloo pairs them blindly
    and hangs, or, when the calls happen to move as many bytes, completes with
    the wrong partner's data; simdist names the mismatch."""
    if d.aspect != "status" or "CollectiveMismatchError" not in d.simdist:
        return False
    if d.gloo.startswith("hang"):
        return True
    skipped = any(step["skip"] for step in program.steps[: d.index + 1])
    return skipped and d.gloo == "ok"


def _reduce_non_root_scratch(program: Program, s: dict[str, Any], d: Difference) -> bool:
    """gloo's reduce uses the non-root members' tensors as scratch space."""
    members = program.members(s)
    return s["op"] == "reduce" and d.aspect == "backward" and members.index(d.rank) != s["root"]


def _uneven_all_to_all(program: Program, s: dict[str, Any], d: Difference) -> bool:
    return (
        s["op"] == "all_to_all"
        and s["uneven"]
        and d.aspect == "status"
        # A member whose own sizes pass gloo's check enters the call and waits
        # for the members that were refused.
        and ("ProcessGroupGloo::alltoall: invalid tensor size" in d.gloo or d.gloo.startswith("hang"))
    )


def _autograd_visible_copies(program: Program, s: dict[str, Any], d: Difference) -> bool:
    return s["saved"] and d.aspect == "status" and "is a view and is being modified inplace" in d.gloo


def _nn_broadcast_group_rank(program: Program, s: dict[str, Any], d: Difference) -> bool:
    """torch's _Broadcast.backward keeps the gradient on the member whose group
    rank equals the global source rank: on a subgroup that is not 0..n-1 that
    is a non-root member of the reduce, whose tensor is scratch on gloo."""
    if s["op"] != "nn_broadcast" or d.aspect != "grad":
        return False
    members = program.members(s)
    src = members[s["root"]]
    return members.index(d.rank) == src and d.rank != src


def _nn_gloo_branch(program: Program, s: dict[str, Any], d: Difference) -> bool:
    return s["op"] == "nn_all_gather" and d.aspect == "status" and "is not part of group" in d.gloo


KNOWN: tuple[Known, ...] = (
    Known(
        "non-contiguous-written-as-contiguous",
        "gloo's all_reduce, reduce, broadcast, scatter, reduce_scatter (list) and "
        "all_to_all_single treat a non-contiguous tensor as if it were contiguous: they write the "
        "first numel elements of its storage (outside the view) and leave the view's own elements "
        "wrong, silently (right only for a dense permuted layout shared by every member); NCCL "
        "refuses such tensors ('Tensors must be contiguous'); simdist refuses them too, naming the "
        "strides. Intended: the stricter of the two real backends",
        {"world": 2, "seed": 1, "steps": [{"op": "all_reduce", "view": "strided", "dtype": "int64"}]},
        _non_contiguous_written_as_contiguous,
    ),
    Known(
        "non-contiguous-into-tensor",
        "all_gather_into_tensor and reduce_scatter_tensor with a non-contiguous output: gloo "
        "accepts it; simdist refuses ('output_tensor must be contiguous'), as NCCL does. "
        "Intended: the stricter of the two real backends",
        {"world": 2, "seed": 1, "steps": [{"op": "all_gather_into_tensor", "view": "strided"}]},
        _non_contiguous_into_tensor,
    ),
    Known(
        "completes-without-a-member",
        "when a member never makes a call (it skipped it, or it is stuck at an earlier step in "
        "both worlds), "
        "gloo's members that need nothing from it return: a "
        "broadcast's receivers when the missing member is not the root, every member when the "
        "tensors have no elements; simdist's members all wait (DeadlockError), as the program "
        "hangs on gloo too (the root, or the next call). Intended: simdist is stricter",
        {"world": 2, "seed": 1, "steps": [{"op": "all_gather", "shape": [0], "skip": True}]},
        _completes_without_a_member,
    ),
    Known(
        "stacked-all-gather-into-tensor",
        "gloo's all_gather_into_tensor accepts only the concatenated output ([n * d0, ...]): it "
        "refuses the stacked form [n, *shape] that torch documents (and NCCL accepts), 0-dim "
        "inputs included ('ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected "
        "(1), got (1, 1))'); simdist accepts both forms, as NCCL does (it checks only that the "
        "output has group size times the input's elements). Intended: torch's documented "
        "semantics, which NCCL implements",
        {"world": 2, "seed": 1, "steps": [{"op": "all_gather_into_tensor", "shape": []}]},
        _stacked_all_gather_into_tensor,
    ),
    Known(
        "stacked-reduce-scatter-tensor",
        "gloo's reduce_scatter_tensor needs input dim 0 = n * output dim 0 ('Check failed: "
        "outputShape[0] * worldSize == inputShape[0]', or 'output with shape [1] doesn't match the "
        "broadcast shape [1, 1]'): it refuses the stacked [n, *shape] input torch documents (and "
        "NCCL accepts), and a 0-dim output kills the gloo process (SIGSEGV); "
        "simdist accepts both forms, as NCCL does. Intended: torch's documented semantics",
        {"world": 2, "seed": 1, "steps": [{"op": "reduce_scatter_tensor", "shape": [2], "stack": True}]},
        _stacked_reduce_scatter_tensor,
    ),
    Known(
        "mismatch-detected",
        "members reach different collectives at the same point of a group (a member skipped "
        "one): gloo pairs them by order and hangs, or completes with the wrong partner's data "
        "when the two calls move as many bytes (an all_reduce of shape [1] met by one of shape "
        "[]); simdist raises CollectiveMismatchError naming both calls. Intended: simdist is "
        "stricter",
        {
            "world": 2,
            "seed": 1,
            "steps": [{"op": "all_reduce", "skip": True}, {"op": "broadcast", "root": 1}],
        },
        _mismatch_detected,
    ),
    Known(
        "reduce-non-root-scratch",
        "gloo's reduce overwrites the tensors of members that are not the root (scratch space for "
        "partial results: torch specifies only the root's result); simdist leaves "
        "them unchanged, so a backward through a non-root tensor saved before the reduce differs. "
        "The campaign compares only the root's result",
        {
            "world": 3,
            "seed": 1,
            "steps": [{"op": "reduce", "values": "randn", "saved": True, "root": 0}],
        },
        _reduce_non_root_scratch,
    ),
    Known(
        "uneven-all-to-all",
        "gloo's all_to_all (list form) needs every output tensor to have the size of the input "
        "tensor of the same index ('ProcessGroupGloo::alltoall: invalid tensor size at index 1 "
        "(expected (0), got (2))'), and a member whose own sizes pass that check then waits "
        "forever for the refused ones; torch documents uneven sizes and NCCL accepts them; so does "
        "simdist. Intended: NCCL's semantics",
        # Shrunk by a campaign: ranks 0 and 2 are refused, rank 1 waits.
        {
            "world": 3,
            "seed": 3837,
            "steps": [{"op": "barrier"}, {"op": "all_to_all", "uneven": True, "shape": [1]}],
        },
        _uneven_all_to_all,
    ),
    Known(
        "autograd-visible-gloo-copies",
        "gloo's all_gather_into_tensor splits its output with a torch op autograd records, so an "
        "output that requires grad (a non-leaf) is refused ('Output 0 of Split is a view and is "
        "being modified inplace'); NCCL writes the output buffer directly, and so does simdist "
        "(outside autograd; its version counter moves as gloo's does). Intended: gloo's split is "
        "an implementation detail a cluster does not share",
        {"world": 2, "seed": 1, "steps": [{"op": "all_gather_into_tensor", "saved": True}]},
        _autograd_visible_copies,
    ),
    Known(
        "nn-functional-gloo-branch",
        "torch.distributed.nn.functional branches on the backend's name: under gloo, all_gather's "
        "backward goes through _AlltoAll, which emulates all_to_all with dist.scatter(..., src=i) "
        "passing a group rank where a global rank is expected, so it fails on a subgroup that is "
        "not ranks 0..n-1 ('Global rank 1 is not part of group'), a torch bug; under simdist "
        "(neither gloo nor NCCL) torch takes its generic all_to_all path, which works",
        {"world": 3, "seed": 1, "steps": [{"op": "nn_all_gather", "group": [0, 2]}]},
        _nn_gloo_branch,
    ),
    Known(
        "nn-broadcast-group-rank",
        "torch.distributed.nn.functional.broadcast's backward compares the global source rank "
        "with the member's group rank (a torch bug): on a subgroup that is not ranks 0..n-1 the "
        "source's gradient is zeroed and the member whose group rank equals the source's global "
        "rank keeps its tensor from the backward reduce, where it is not the root; that tensor is "
        "scratch on gloo (reduce-non-root-scratch) and unchanged on simdist, so the two gradients "
        "differ; both are torch's wrong answer",
        {"world": 4, "seed": 0, "steps": [{"op": "nn_broadcast", "group": [1, 2, 3], "shape": []}]},
        _nn_broadcast_group_rank,
    ),
    Known(
        "barrier-rethrows-refused-async",
        "an async call that the backend refuses (BAND on a float tensor, AVG on int8), then a "
        "barrier: gloo accepts the call and fails its Work on a worker thread, and a barrier "
        "issued while that Work is still queued or running waits for it and raises the same "
        "error (a race: 2 of 3 runs of the minimal program, none with half a second between the "
        "two), and a member whose barrier did not see the Work waits for the one that raised (a "
        "hang); simdist refuses the call at its issue, as NCCL refuses an unsupported reduce op, "
        "so nothing is in flight and its barrier completes. The refused call fails on both. "
        "Intended: the refusal is earlier, and deterministic",
        {
            "world": 2,
            "seed": 1,
            "steps": [
                {"op": "all_reduce", "red": "BAND", "shape": [1], "async": True},
                {"op": "barrier"},
            ],
        },
        _barrier_rethrows_refused_async,
        tries=8,
        after_refusal=True,
    ),
    Known(
        "work-result",
        "work.result() (a deprecated API) differs: gloo's raises for isend/irecv Works and returns "
        "every output of all_gather_into_tensor's Work; simdist returns the written tensors "
        "(harmless: the results are in the tensors passed). Intended: a deprecated API whose "
        "result torch does not specify per backend",
        {"world": 2, "seed": 1, "steps": [{"op": "send_recv", "root": 0, "peer": 1, "async": True}]},
        _work_result,
    ),
)


def explain(program: Program, d: Difference, found: Sequence[Difference] = ()) -> Known | None:
    """The entry explaining ``d``; ``found``: every difference of the program."""
    s = program.steps[d.index]
    for known in KNOWN:
        if known.after_refusal and not _refused_before(d, found):
            continue
        if known.matches(program, s, d):
            return known
    return None


def _refused_before(d: Difference, found: Sequence[Difference]) -> bool:
    # Any member's: in gloo's race, a member whose barrier hung never waited
    # for its own refused Work.
    return any(e.aspect == "both_refused" and e.index < d.index for e in found)


def new_differences(program: Program, found: list[Difference]) -> list[Difference]:
    """The differences no registry entry explains. A known difference in whether a
    call was made (one world refused or hung) changes what every later step
    sees, so differences after it are its consequences, not new ones."""
    cut = min((d.index for d in found if _known_divergence(program, d, found)), default=len(program.steps))
    return [
        d
        for d in found
        if d.aspect != "both_refused"
        and d.index <= cut
        and explain(program, d, found) is None
        and not _left_waiting(d, cut)
    ]


def _known_divergence(program: Program, d: Difference, found: Sequence[Difference]) -> bool:
    """A known difference in whether a call was made; or both worlds refused
    it, gloo for a reason the registry knows (had simdist made the call, that
    would be a known difference): from there on the worlds differ as known."""
    if d.aspect == "status":
        return explain(program, d, found) is not None
    if d.aspect == "both_refused":
        return explain(program, replace(d, aspect="status", simdist="ok"), found) is not None
    return False


def _left_waiting(d: Difference, cut: int) -> bool:
    """At the step where a known difference stopped one member (simdist refused
    its call), the members that made theirs wait for it: on simdist that wait
    ends in DeadlockError, or in CollectiveMismatchError when the refused
    member went on to its next call. A consequence, not a new difference."""
    return (
        d.index == cut
        and d.aspect == "status"
        and d.gloo == "ok"
        and ("DeadlockError" in d.simdist or "CollectiveMismatchError" in d.simdist)
    )
