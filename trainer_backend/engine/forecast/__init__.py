"""What a config will need before it runs: memory per device for every strategy, without a GPU.

    memory_trace     one training step traced under fake tensors: every tensor's bytes while it lives
    memory_estimate  parameters, gradients, optimizer state, activations and buffers per device, as each
                     strategy places them (``memory_placement`` beside its ``wrap``)
    memory_fit       the estimate against each device's free memory: a verdict, and changes that would fit

The Launch page and the ``estimate`` command ask it; rank 0 stores it beside what the run then measures.
"""
