"""The pytest plugin's old module name, kept for installs whose ``pytest11``
entry point still names it (an editable install made before the move); the
plugin lives in ``simdist._pytest.plugin``. Loading it by hand needs the entry
point's copy blocked first: ``-p no:simdist -p simdist.pytest_plugin``.

The old name is the plugin module itself (not a copy of its names), so every
hook and fixture the plugin gains is there too."""

import sys

from ._pytest import plugin

sys.modules[__name__] = plugin
