"""The suite, laid out as the product is: the tests of ``x/y.py`` are in ``tests/x/test_y.py`` (or
``test_y_<aspect>.py``), so ``tests/trainer_backend/rank/test_models.py`` tests
``trainer_backend/rank/models.py``. Behaviour across processes and modules has folders named for it:
``e2e/`` (a real browser, whole runs through the CLI), ``system/`` (faults, access, input checked at every
edge, the GPU paths) and ``project/`` (checks on the project itself: layers, package, tiers, this layout).

Every folder is a package (``tests.db.test_store``), so the same file name may sit in two folders, and a rank
that a test spawns imports its target's module by that name. Helpers that are not fixtures are in
``support.py``; fixtures and the tiers' hooks in ``conftest.py``.
"""
