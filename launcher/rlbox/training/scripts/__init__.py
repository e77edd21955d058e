"""Scripts that run inside containers, never imported by rlbox itself: their source is sent
to the container (python3 -c SOURCE) or mounted into it."""
