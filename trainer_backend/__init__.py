"""Parallax's training backend, in rooms by the process each part runs in.

    dashboard (pages) / CLI ─▶ control      validate, launch, cancel, delete          (no torch at import)
                                  │ detached process: python -m trainer_backend supervisor N
                                  ▼
                               supervisor       claim the run, preflight, start the ranks, sample, record the end
                                  │ spawned / forked ranks, or torchrun's
                                  ▼
                               engine       one rank: build (datasets, models, strategies) -> train -> teardown
                                  │ measures with
                                  ▼
                               telemetry    step points, system samples, profiler, MFU, memory, energy
    every room reads ─────────▶ contract/    (the package below every other) RunConfig, devices, limits: torch-free
                                datasets     folders and built-in sets, decoded once, cached and split

Arrows run down only (tests/project/test_layers.py checks it): a room never imports one above it, and the
backend imports ui/ and pages/ never: it writes through db/ and reports/, and reads contract/.
"""
