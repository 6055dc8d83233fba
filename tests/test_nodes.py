"""The test cluster's helpers (tests/nodes.py)."""

import nodes


def test_a_free_port_is_never_one_a_ray_node_takes_for_itself(monkeypatch):
    """A CI run failed when the system's free port for a head was 52365, the port Ray's dashboard
    agent takes on every node: the head never started."""
    offered = iter([52365, 8265, 10001, 15000, 41234])

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(nodes.socket, "socket", Socket)
    assert nodes.free_port() == 41234
