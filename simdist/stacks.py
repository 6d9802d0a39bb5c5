"""Where user code called from: call sites and stacks without simdist's frames."""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import traceback
from types import FrameType


def _torch_dir() -> str:
    """torch's package folder, found without importing torch where it is not
    imported yet: the command line's refusals of bad input (``simdist fuzz``,
    ``simdist replay``) come before torch's 1-2 s import."""
    module = sys.modules.get("torch")
    origin = getattr(module, "__file__", None)
    if origin is None:
        spec = importlib.util.find_spec("torch")
        origin = spec.origin if spec is not None else None
    if origin is None:  # (a torch without a file: ask the package itself)
        import torch

        origin = torch.__file__
    assert origin is not None
    return os.path.dirname(os.path.abspath(origin))


_SIMDIST_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = _torch_dir()
# Frames in these places are plumbing, not the user's program: simdist, all of
# torch (the dispatcher's torch/_ops.py behind functional collectives, module
# hooks, DTensor), and the files whose wrappers torch puts around its API
# (typing_extensions' @deprecated around all_gather_into_tensor and
# reduce_scatter_tensor on torch 2.13).
_HIDDEN = (_SIMDIST_DIR + os.sep, _TORCH_DIR + os.sep)
_WRAPPER_FILES = frozenset(
    os.path.abspath(m.__file__)
    for m in (__import__("threading"), __import__("functools"), __import__("contextlib"))
    if m.__file__
)
try:
    import typing_extensions as _typing_extensions

    if _typing_extensions.__file__:
        _WRAPPER_FILES = _WRAPPER_FILES | {os.path.abspath(_typing_extensions.__file__)}
except ImportError:  # torch depends on it, but never fail over a report detail
    pass


def _is_user(filename: str) -> bool:
    return not filename.startswith(_HIDDEN) and filename not in _WRAPPER_FILES


def _short(filename: str) -> str:
    """A path relative to the working directory when inside it (never absolute
    paths of this machine in reports meant to be pasted into issues)."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return os.path.basename(filename)
    return os.path.basename(filename) if rel.startswith("..") else rel


# id(code object) -> (the code object, short file name of user code or None
# for plumbing). Every collective asks for its call site, so path work is done
# once per function. Keyed by id because hashing a code object hashes its
# contents on every lookup; the entry keeps the code object alive, so its id
# cannot be reused by another one while the entry exists (and the identity
# check below guards the lookup all the same).
_site_cache: dict[int, tuple[object, str | None]] = {}


# The standard library's own modules (``copy.deepcopy`` running a tensor's
# ``__deepcopy__``): the user's line is the one that called into them. Packages
# installed beside it (site-packages) are user code.
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_DISPATCH_HANDLERS = frozenset({"__torch_dispatch__", "__torch_function__"})


def _is_site(filename: str) -> bool:
    if not _is_user(filename):
        return False
    return not filename.startswith(_STDLIB) or "site-packages" in filename or "dist-packages" in filename


def call_site(skip: int = 1, *, outside_dispatch: bool = False) -> str:
    """``file:line`` of the nearest user frame above the caller.

    ``outside_dispatch``: above every ``__torch_dispatch__`` or
    ``__torch_function__`` handler on the stack too (a user's mode or
    subclass forwarding the op), so the line is the one that ran the op."""
    frame: FrameType | None = sys._getframe(skip)
    if outside_dispatch:
        outermost, walk = None, frame
        while walk is not None:
            if walk.f_code.co_name in _DISPATCH_HANDLERS:
                outermost = walk
            walk = walk.f_back
        if outermost is not None:
            frame = outermost.f_back
    for _ in range(40):
        if frame is None:
            break
        code = frame.f_code
        entry = _site_cache.get(id(code))
        if entry is not None and entry[0] is code:
            short = entry[1]
        else:
            filename = os.path.abspath(code.co_filename)
            short = _short(filename) if _is_site(filename) else None
            _site_cache[id(code)] = (code, short)
        if short is not None:
            return f"{short}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def user_stack(frame: FrameType | None, limit: int = 12) -> list[str]:
    """The user's frames of a (blocked) thread, innermost last."""
    if frame is None:
        return []
    out = []
    for fs in traceback.extract_stack(frame):
        if _is_user(os.path.abspath(fs.filename)):
            out.append(f"{_short(fs.filename)}:{fs.lineno} in {fs.name}")
    return out[-limit:]
