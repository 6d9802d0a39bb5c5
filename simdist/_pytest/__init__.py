"""simdist's pytest plugin: ``plugin`` (the hooks and fixtures pytest loads),
``marker`` (what ``@pytest.mark.simdist`` asks for), ``runner`` (running a
marked test on the simulator, spawned processes or torchrun), ``remote``
(finding the test in a rank process), ``torchrun`` (joining a launched
world) and ``profiles`` (``--simdist-profile``)."""
