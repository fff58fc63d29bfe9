"""Engine replicas on Ray Serve with session- and prefix-aware routing (``pip install swiftlm[ray]``).

``routing`` is pure logic and imports no Ray; everything else here does, so nothing outside this
package imports it unless ``--replicas`` is asked for.
"""

from __future__ import annotations

from typing import Any


def build_app(config: Any) -> Any:
    """The Serve application (``swiftlm.cluster.app.build_app``), for ``serve run swiftlm.cluster:build_app``."""
    from swiftlm.cluster.app import build_app as build

    return build(config)
