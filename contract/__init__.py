"""The contract every package and process reads: the bottom of the house, with nothing but the standard library
beneath it (tests/project/test_layers.py, LAYERS).

    dashboard / CLI ──RunConfig──▶ supervisor ──RunConfig──▶ each rank
          └── all of them read: config (RunConfig, its limits), strategy_specs (what each strategy is), fields (each field's help, bounds and flag,
              which the CLI's flags and the Launch form's widgets are built from), devices (this machine's GPUs and CPU
              slots), world (the torchrun world a process was started in), and what those need: printable
              text, a model's source (model_source), Slurm's options (slurm_options), where Parallax keeps
              its state (environment: PARALLAX_HOME, the data folder, the database URL), and how it starts
              Python processes (python_process: the database's webhook threads and the backend's processes
              both need it, and the `parallax` command reads it before it loads anything else)

Safe file writes (storage: a full disk becomes one line) stay here too: the database, the reports, the SDK and
every room of the backend write through them, and the command line reads them before it loads the database. The
other helpers of the processes that run live where they are used: the run's log guard in
trainer_backend/telemetry/logguard.py, plugins in trainer_backend/rank/plugins.py, how a process that trains
imports the training code in trainer_backend/supervisor/startup.py.

Torch-free: the dashboard and the launcher import it without loading torch.
"""
