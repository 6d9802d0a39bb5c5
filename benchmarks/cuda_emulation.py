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
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


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


def _export(rev: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="simdist-before-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def _measure(tree: Path, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", variant]
    command += ["--worlds", args.worlds, "--calls", str(args.calls), "--runs", str(args.runs)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


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
    print(f"load average before: {os.getloadavg()}")
    variants: list[tuple[str, Path, str]] = [
        ("cpu", ROOT, "cpu"),
        ("emulated", ROOT, "emulated"),
        ("do-nothing layers", ROOT, "layers"),
    ]
    before = _export(args.before) if args.before else None
    if before is not None:
        variants.append((f"cpu @ {args.before}", before, "cpu"))
        variants.append((f"emulated @ {args.before}", before, "emulated"))
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
    try:
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else list(reversed(variants))
            for name, tree, variant in order:
                samples[name].append(_measure(tree, variant, args))
    finally:
        if before is not None:
            shutil.rmtree(before, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")
    print(
        f"{'world':>5}  {'variant':<22} {'wall/call':>10} {'cpu/call':>10} {'wall x cpu':>10} {'cpu x cpu':>10}"
    )
    for world in worlds:
        key = str(world)
        base_wall = statistics.median(s[key]["wall"] for s in samples["cpu"])
        base_cpu = statistics.median(s[key]["cpu"] for s in samples["cpu"])
        for name, _, _ in variants:
            wall = statistics.median(s[key]["wall"] for s in samples[name])
            cpu = statistics.median(s[key]["cpu"] for s in samples[name])
            print(
                f"{world:>5}  {name:<22} {wall * 1e6:>8.0f}us {cpu * 1e6:>8.0f}us "
                f"{wall / base_wall:>9.2f}x {cpu / base_cpu:>9.2f}x"
            )


if __name__ == "__main__":
    main()
