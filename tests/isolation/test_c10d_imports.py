"""A torch.distributed module first imported inside a rank must not keep that
rank's world group as a default argument (``group=group.WORLD`` is evaluated
at import): later calls without ``group=`` in other ranks and later runs
would be handed a group that is not theirs.

Each check runs in a fresh interpreter: the import has to be the process's first.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import sys, warnings
    import torch
    import torch.distributed as dist
    import simdist

    warnings.simplefilter("ignore", FutureWarning)  # nn.functional is deprecated
    assert "torch.distributed.nn.functional" not in sys.modules

    def ddp(ctx):
        # DDP imports torch.distributed.nn.functional on first use, inside rank 0 or 1.
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        model(torch.ones(1, 2)).sum().backward()
        assert "torch.distributed.nn.functional" in sys.modules
        import torch.distributed.nn.functional as F
        # Another rank of the same run, no group= given.
        return F.all_reduce(torch.tensor([float(ctx.rank + 1)])).item()

    def later_run(ctx):
        import torch.distributed.nn.functional as F
        x = torch.tensor([10.0 * ctx.rank, 10.0 * ctx.rank + 1])
        return F.all_to_all_single(torch.empty(2), x).tolist()

    assert simdist.run(ddp, world_size=2) == [3.0, 3.0]
    assert simdist.run(later_run, world_size=2) == [[0.0, 10.0], [1.0, 11.0]]
    import torch.distributed.nn.functional as F
    assert F.all_to_all_single.__defaults__[-1] is None, F.all_to_all_single.__defaults__
    print("OK")
    """
)


def test_nn_functional_imported_first_in_a_rank_defaults_to_the_callers_default_group() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )


CHILD_BOTH = textwrap.dedent(
    """
    import sys
    import torch.distributed.tensor as dtensor
    import simdist
    from simdist._isolation import c10d_imports

    assert "megatron" not in sys.modules  # else the fresh-globals finder is not installed

    def body(ctx):
        ours = [f for f in sys.meta_path if f is c10d_imports.FINDER or type(f).__name__ == "_FreshGlobals"]
        assert len(ours) == 2, sys.meta_path  # both are installed during this run
        spec = sys.meta_path[0].find_spec("torch.distributed.tensor._api", dtensor.__path__)
        loaders, loader = [], spec.loader
        while loader is not None:
            loaders.append(type(loader).__name__)
            loader = getattr(loader, "loader", None)  # each wrapper keeps the loader it wraps
        return loaders

    print("LOADERS", simdist.run(body, world_size=1, timeout=60)[0])
    """
)


def test_two_of_simdists_finders_wanting_one_module_both_wrap_it_without_asking_each_other_for_ever() -> None:
    """DTensor's ``_api`` is watched by rank_local_defaults' finder and is a
    torch.distributed module for c10d_imports' finder: each asks the other
    finders for the spec, so the two once asked each other until the stack
    ran out (RecursionError), for a rank that first imported the module. In
    a fresh interpreter: the fresh-globals finder is installed only in a
    process that has not imported Megatron."""
    proc = subprocess.run([sys.executable, "-c", CHILD_BOTH], capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("LOADERS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    loaders = eval(lines[-1][len("LOADERS ") :])
    assert loaders[:2] in (["_Unrouted", "_Recording"], ["_Recording", "_Unrouted"]), loaders
    assert loaders[-1] == "SourceFileLoader", loaders
