"""Around a training run: datasets before it, metrics and triage of its job, merging its
checkpoints, serving and evaluating the result. Each runs in the training image.

Uses rlbox.core, rlbox.image and rlbox.cluster.
"""
