"""The testbed (`rlbox testbed up/down/status`): several real hosts on this one machine, each in
its own network, mount and PID namespace with its own Docker engine and sshd, and the Ascend
host's NPU stand-ins. A tool for rehearsing and testing the production path (`rlbox run
--cluster`); no production module imports it (tests/test_architecture.py checks)."""
