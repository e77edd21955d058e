"""Backends of `rlbox run`: where a run's nodes come from and how its plan is carried out.

Every backend has one shape (``base.Backend``): a resolved run request becomes a printable plan
(``plan``: `--dry-run` prints ``describe()`` and touches nothing), ``submit`` carries it out, and
``stop`` ends the run it made. ``hosts`` (containers over ssh; ``--sim``: on this engine),
``slurm`` (an allocation, then the hosts path on its nodes) and ``kuberay`` (a RayJob) sit behind it;
the CLI picks one by name (``base.get``) and knows none of their details.
"""
