"""The image build system: the version matrix (images/*.yaml), its lock, rendering, building,
offline sources, mirrors, provenance and diff of built images, the CI workflow, push and pull.

Uses rlbox.core and rlbox.registry; never the cluster launcher.
"""
