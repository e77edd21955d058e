"""Shared core: the one error type, the project root, the container engine, NPU facts, config files.

Imports nothing else of rlbox: every other subpackage may use it.
"""
