"""What a run's processes measure while they train, for the dashboard's charts.

    each rank ─▶ steps (loss and images/s per step), profiling (torch.profiler windows), flops and
        measures (MFU), memory_breakdown (what each device holds), rank_times (stragglers),
        energy and job_energy (counters of the hardware); recorder writes what the rank that records
        the run writes (and waits out a locked database), a no-op one on every other rank
    the supervisor ─▶ sampler (CPU, memory, GPU of every process, in a thread), machine_samples (other
        machines' samples through torchrun's store)

Everything here is measured from tensors, timers and counters, never estimated.
"""
