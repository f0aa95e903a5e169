"""One rank's engine: setup -> build -> train -> teardown, the same for every strategy.

    supervisor ─▶ rank.trainer.main (per rank): build the data (datasets), the model (models, speed), the
        strategy (strategies: how the model, batch and collectives are placed), then loop epochs (loop,
        schedule, inputs, augment, batchnorm, confusion), checkpoint (resume) and record (telemetry)

Rank 0 writes the database; the other ranks only compute.
"""
