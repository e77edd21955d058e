"""``hosts.on_every``: every item's failure comes back as one line naming its host, whatever the item
(a node, a host, a (plan, node) pair) and whatever the exception (a container removed under a
`docker ps` by a racing `rlbox run --replace` once came back as the repr of a whole plan)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlbox.cluster.hosts import host_name_of, on_every
from rlbox.core.errors import RlboxError

HOST = SimpleNamespace(name="10.0.0.2")


@pytest.mark.parametrize("item, name", [
    (SimpleNamespace(host=HOST), "10.0.0.2"),  # a node
    (HOST, "10.0.0.2"),  # a host
    ((SimpleNamespace(index=1, host=HOST), SimpleNamespace(host=HOST, client=None)), "10.0.0.2"),  # (plan, node)
    ((1, 2), "tuple"),
])
def test_an_item_is_named_by_its_host(item, name):
    assert host_name_of(item) == name


def test_an_unexpected_exception_is_one_line_naming_the_host():
    pair = (SimpleNamespace(index=0, host=HOST, container="x" * 500), SimpleNamespace(host=HOST))

    def boom(item):
        raise LookupError("404 Client Error: No such container: cb267cfd")

    results, errors = on_every(boom, [pair])
    assert results == [] and len(errors) == 1 and isinstance(errors[0], RlboxError)
    assert str(errors[0]) == "10.0.0.2: LookupError: 404 Client Error: No such container: cb267cfd"
