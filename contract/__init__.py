"""The contract every package and process reads: the bottom of the house, with nothing but the standard library
beneath it (tests/project/test_layers.py, LAYERS).

    dashboard / CLI ──RunConfig──▶ worker ──RunConfig──▶ each rank
          └── all of them read: config (RunConfig, its limits), strategy_specs (what each strategy is), fields (each field's help, bounds and flag,
              which the CLI's flags and the Launch form's widgets are built from), devices (this machine's GPUs and CPU
              slots), world (the torchrun world a process was started in), plugins, printable text,
              the file writers that turn a full disk into one line (storage, logguard), and where Parallax
              keeps its state (environment: PARALLAX_HOME, the data folder, the database URL)

Torch-free: the dashboard and the launcher import it without loading torch.
"""
