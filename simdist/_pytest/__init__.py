"""simdist's pytest plugin: ``plugin`` (the hooks and fixtures pytest loads,
joining a torchrun world), ``marker`` (what ``@pytest.mark.simdist`` asks
for), ``runner`` (running a marked test on the simulator, spawned processes or
torchrun) and ``profiles`` (``--simdist-profile``)."""
