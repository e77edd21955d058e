"""A Registry v2 client: references, credentials, Basic and Bearer auth, tags, manifests, configs.

Knows nothing of the matrix; the image build system uses it (lock digests, push/pull, diff).
"""
