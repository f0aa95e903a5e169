"""What a config will need before it runs: memory per device for every strategy, without a GPU.

    memory_trace     one training step traced under fake tensors: every tensor's bytes while it lives
    memory_estimate  parameters, gradients, optimizer state, activations and buffers per device, as each
                     strategy places them (strategies/placements.py, named by each strategy's class)
    free_memory      each device's free memory and whether an estimate fits it, in words (torch-free: the
                     dashboard reads it in its own process)
    memory_fit       the changes that would fit, each estimated; the estimate as a text table

The Launch page and the ``estimate`` command ask it; rank 0 stores it beside what the run then measures.
"""
