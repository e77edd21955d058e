"""Scripts rlbox runs inside a built image (standalone files: read their path, never import them)."""
