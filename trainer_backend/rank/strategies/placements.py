"""Where each strategy puts a run's memory, for the estimate before launch (rank/forecast/memory_estimate.py):
one function per strategy, which its class names (``memory_placement = staticmethod(placements.replicas)``), fed
a plan that knows the model, the batch and the devices and returns each device's parts.

    whole_model      single: the model whole on its device, training on the whole batch
    replicas         ddp: a full replica per process, and DDP's gradient buckets
    data_parallel    dp: the first GPU holds the model and the batch, the others replicas made each step
    model_stages     mp: stage i on device i, each on the whole batch
    pipeline_stages  pp: stage i on process i, on microbatches, with its receive buffers
    sharded          fsdp: 1/N of every parameter, gradient and optimizer state, and gathered units
"""

from __future__ import annotations


def whole_model(plan) -> list:
    """The model whole on its device, training on the whole batch (see memory_estimate.py)."""
    (label,) = plan.labels()
    return [plan.whole(label, plan.config.batch_size)]


def replicas(plan) -> list:
    """A full replica per process on its share of the batch, and DDP's gradient buckets
    (bucket_cap_mb 25, together as large as the gradients) for the all-reduce."""
    devices = []
    for label in plan.labels():
        device = plan.whole(label, plan.config.per_device_batch)
        device.comm = device.gradients
        devices.append(device)
    return devices


def data_parallel(plan) -> list:
    """On GPUs, the first holds the model, its gradients and optimizer state, the whole input
    batch and the gathered outputs; every other GPU a replica of the parameters (made anew each
    step) with their gradients, for its share of the batch. On CPU a pass-through: single's."""
    config = plan.config
    if not config.uses_cuda:
        return [plan.whole("cpu", config.batch_size)]
    share = config.per_device_batch
    # Over several GPUs each replica's forward runs in a thread of its own, apart from the thread that crops.
    first = plan.whole(config.devices[0], share, forward_elsewhere=len(config.devices) > 1)
    rest_of_batch = config.batch_size - share
    first.activations += (rest_of_batch * plan.input_bytes_per_image()
                          + config.batch_size * plan.num_classes * 4)
    trace = plan.trace(share)
    replicas = []
    for label in config.devices[1:]:
        replica = plan.held(label, plan.model)
        parameters = replica.parameters + replica.activations  # broadcast weights and buffers
        replica = type(replica)(label, activations=parameters + trace.backward_peak)
        replica.add_workspace(plan.blas_workspace(label, trace, takes_input=False))
        replicas.append(replica)
    return [first, *replicas]


def model_stages(plan) -> list:
    """Stage i (its layers' parameters, gradients, optimizer state) on device i, each training
    on the whole batch; stages sharing one device (CPU) are one step of the whole model."""
    config = plan.config
    if len(set(config.devices)) == 1:
        return [plan.whole(config.devices[0], config.batch_size)]
    # One process: its thread crops the batches on the first stage's GPU.
    return [plan.stage_memory(label, i, config.batch_size, takes_input=i == 0)[0]
            for i, label in enumerate(config.devices)]


def pipeline_stages(plan) -> list:
    """Stage i on process i, training on microbatches: GPipe runs every microbatch's forward
    before any backward, so a stage keeps m microbatches' activations; 1F1B keeps at most
    p - i. Receive buffers are made up front, one per microbatch: the activations coming in
    (after the first stage) and their gradients coming back (before the last). The first
    stage also holds the whole batch it cuts up."""
    config = plan.config
    stages, m = config.world_size, config.microbatches
    micro = config.batch_size // m
    devices = []
    for i, label in enumerate(plan.labels()):
        device, trace = plan.stage_memory(label, i, micro, takes_input=i == 0)  # the first stage crops
        in_flight = m if config.pipeline_schedule == "gpipe" else min(m, stages - i)
        kept = max(0, trace.forward_kept - trace.input_bytes)
        device.activations += (in_flight - 1) * kept
        if i == 0:
            device.activations += (m - 1) * trace.input_bytes
        # What comes in is what the stage before sends: its output, in autocast's dtype.
        incoming = plan.trace(micro, i - 1).output_bytes if i > 0 else 0
        device.comm = m * (incoming + (trace.output_bytes if i < stages - 1 else 0))
        devices.append(device)
    return devices


def sharded(plan) -> list:
    """Each process holds 1/N of every parameter, gradient and optimizer state (padded shards),
    the activations of its share of the batch, and gathered units: in backward the unit being
    computed, the next one prefetched and the first's unsharded gradients (three times the
    largest unit), plus the root's own parameters, which stay gathered."""
    world, batch = plan.config.world_size, plan.config.per_device_batch
    trace = plan.trace(batch)
    units = plan.fsdp_units()
    devices = []
    for rank, label in enumerate(plan.labels()):
        device = plan.shard(label, rank, world)
        device.activations += trace.backward_peak - trace.grads_at_peak
        device.add_workspace(plan.blas_workspace(label, trace))
        device.comm = 3 * max(units[:-1], default=0) + units[-1]
        devices.append(device)
    return devices
