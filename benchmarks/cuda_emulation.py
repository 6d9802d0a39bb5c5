"""What CUDA emulation costs: small all_reduces on emulated tensors against the
same on CPU tensors, and (``--before REV``) CPU runs of this tree against another
revision's, in alternating child processes.

Each child runs, per world, a body of ``--calls`` all_reduces of 16 floats (a
tensor made, reduced, read back: ``t.add_(1)``) ``--runs`` times after a
warm-up, and reports the median wall time per all_reduce and the process's
CPU time per all_reduce. Variants: ``cpu`` (no emulation), ``emulated``
(``cuda="emulate"``, tensors on ``"cuda"``, the sanitizer's stream rules on),
``layers`` (the CPU program through three Python handlers that only forward
each call: the floor of any emulation written in Python), and with
``--before`` the other revision's ``cpu`` and ``emulated``. The table is the median
over rounds and the ratios; the load average is printed before and after.
Prints, never asserts.

    python benchmarks/cuda_emulation.py
    python benchmarks/cuda_emulation.py --before 17a4283 --rounds 6 --worlds 2,4,8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import ExitStack
from typing import Any

from _harness import ROOT, alternate, child_json, exported, load_line, table


def _child(variant: str, worlds: list[int], calls: int, runs: int) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    import simdist

    emulated = variant == "emulated"
    device = "cuda" if emulated else "cpu"
    options: dict[str, Any] = {"cuda": "emulate"} if emulated else {}
    layers = _do_nothing_layers() if variant == "layers" else None

    def body(ctx: Any) -> None:
        if layers is not None:
            kind, function_mode, dispatch_mode = layers
            with function_mode(), dispatch_mode():
                t = torch.zeros(16).as_subclass(kind)
                for _ in range(calls):
                    t.add_(1)
                    dist.all_reduce(t)
            return
        t = torch.zeros(16, device=device)
        for _ in range(calls):
            t.add_(1)
            dist.all_reduce(t)

    out: dict[str, Any] = {}
    for world in worlds:
        for _ in range(3):
            simdist.run(body, world_size=world, **options)
        walls = []
        cpu0 = time.process_time()
        for _ in range(runs):
            t0 = time.perf_counter()
            simdist.run(body, world_size=world, **options)
            walls.append((time.perf_counter() - t0) / calls)
        out[str(world)] = {
            "wall": statistics.median(walls),
            "cpu": (time.process_time() - cpu0) / (runs * calls),
        }
    print(json.dumps(out))


def _do_nothing_layers() -> tuple[type, type, type]:
    """What any Python-level emulation of a device must have, doing nothing:
    a tensor subclass answering its device (``__torch_function__``), a
    function mode catching ``device="cuda"`` factories, and a dispatch mode
    giving results of ops below Python their device. Each forwards the call.
    The ``layers`` variant runs the CPU program through these three: the
    least an emulated op can cost on top of the CPU's."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reported(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))

    class Factories(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    class Below(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    return Reported, Factories, Below


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worlds", default="2,4,8")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--before", default=None, help="a revision whose cpu runs are measured beside")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    if args.child is not None:
        _child(args.child, worlds, args.calls, args.runs)
        return
    print(load_line("at the start"))
    kinds = {"cpu": (ROOT, "cpu"), "emulated": (ROOT, "emulated"), "do-nothing layers": (ROOT, "layers")}
    with ExitStack() as stack:
        if args.before:
            before = stack.enter_context(exported(args.before))
            kinds[f"cpu @ {args.before}"] = (before, "cpu")
            kinds[f"emulated @ {args.before}"] = (before, "emulated")

        def measure(name: str) -> dict[str, Any]:
            tree, variant = kinds[name]
            child = ["--child", variant, "--worlds", args.worlds, "--calls", args.calls, "--runs", args.runs]
            return child_json(__file__, child, path=[tree])

        samples = alternate(list(kinds), args.rounds, measure)
    print(load_line("at the end"))
    rows = []
    for world in worlds:
        key = str(world)
        base_wall = statistics.median(s[key]["wall"] for s in samples["cpu"])
        base_cpu = statistics.median(s[key]["cpu"] for s in samples["cpu"])
        for name in kinds:
            wall = statistics.median(s[key]["wall"] for s in samples[name])
            cpu = statistics.median(s[key]["cpu"] for s in samples[name])
            ratios = f"{wall / base_wall:.2f}x", f"{cpu / base_cpu:.2f}x"
            rows.append([world, name, f"{wall * 1e6:.0f}us", f"{cpu * 1e6:.0f}us", *ratios])
    table(["world", "variant", "wall/call", "cpu/call", "wall x cpu", "cpu x cpu"], rows, align="><>")


if __name__ == "__main__":
    main()
