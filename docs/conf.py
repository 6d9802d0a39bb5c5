"""Sphinx configuration of simdist's documentation site (``make docs``).

Pages are Markdown (MyST-Parser); the API reference comes from the docstrings
(autodoc, napoleon for the Google-style sections some of them use) and the
command-line reference from the real argparse parser (``_ext/simdist_reference.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

import simdist  # noqa: E402

project = "simdist"
author = "the simdist authors"
copyright = "the simdist authors"
release = simdist.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "simdist_reference",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Headings become link targets (`page.md#a-heading`), as on GitHub.
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Only the Python standard library is linked; no network is needed at build time
# when its inventory is absent, since missing inventories are not errors below.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}

html_theme = "furo"
html_title = f"simdist {release}"
html_static_path: list[str] = []
# docs/schemas/*.json are published beside the pages.
html_extra_path = ["schemas"]

# Option names such as --budget must stay as typed, not become dashes.
smartquotes = False
# Blocks without a language (usage lines, transcripts) stay plain text.
highlight_language = "none"
