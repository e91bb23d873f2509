"""The lab's ssh plumbing against a listener that accepts and never greets (an sshd too busy to
send its banner within ConnectTimeout): tried once more, then its error is returned."""

from __future__ import annotations

import socket
import threading

import pytest

from fleetspec.lab import ssh


def test_a_banner_timeout_is_tried_once_more(tmp_path):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.5", 22))       # argv() always uses port 22
    except OSError as err:
        pytest.skip(f"127.0.0.5:22 is taken here: {err}")
    listener.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: [accepted.append(listener.accept()[0]) for _ in range(3)], daemon=True).start()
    (tmp_path / ".lab" / "ssh").mkdir(parents=True)
    try:
        r = ssh.run(tmp_path, "127.0.0.5", "true", timeout=60)
    finally:
        listener.close()
        for c in accepted:
            c.close()
    assert r.returncode == 255 and ssh.BANNER_TIMEOUT in r.stderr, r.stderr
    assert len(accepted) == 2
