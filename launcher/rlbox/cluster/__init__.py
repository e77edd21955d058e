"""The cluster launcher: cluster spec, plan, pre-flight (validate + doctor), execution on the
nodes, Ray readiness, jobs, simulation, recipes and run state.

Uses rlbox.core and rlbox.image (the matrix: which image, which hardware).
"""
