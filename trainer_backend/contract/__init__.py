"""The contract every process reads, and nothing but the standard library and the database beneath it.

    dashboard / CLI ──RunConfig──▶ worker ──RunConfig──▶ each rank
          └── all of them read: config (RunConfig, its limits), strategy_specs (what each strategy is), fields (each field's help, bounds and flag,
              which the CLI's flags and the Launch form's widgets are built from), devices (this machine's GPUs and CPU
              slots), world (the torchrun world a process was started in), plugins, printable text,
              and the file writers that turn a full disk into one line (storage, logguard)

Torch-free: the dashboard and the launcher import it without loading torch.
"""
