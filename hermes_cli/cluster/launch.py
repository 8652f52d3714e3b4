"""Starting a cluster: Ray (a local one, or joining ``ADDRESS``), ``N`` engine actors and the
detached registry; ``Cluster.app()`` is the gateway's FastAPI app (``hermes serve --cluster``).

Engine actors are restarted by Ray when their process dies (an OOM kill, a crash): the registry
fails their streams over first and takes the restarted, empty engine back afterwards. An engine actor asks Ray for ``num_cpus`` CPUs and ``num_gpus`` GPUs (one per GPU engine on a
GPU cluster; 0 and 0 for N engines sharing a test machine's CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from .actors import NAMESPACE, REGISTRY_NAME, ClusterSettings, EngineHost, Registry, engine_actor_name

__all__ = ["Cluster", "start_cluster"]


@dataclasses.dataclass
class Cluster:
    """A running cluster (engines by id, the registry) and how to stop what this process started."""

    settings: ClusterSettings
    serve_settings: Any  # serve.settings.ServeSettings
    engines: dict
    started_ray: bool

    def registry(self):
        import ray

        return ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)

    def app(self):
        from .gateway import create_cluster_app

        return create_cluster_app(self.serve_settings)

    def stop(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.get(self.registry().shutdown.remote(), timeout=10)
        with contextlib.suppress(Exception):
            ray.kill(self.registry())
        for handle in self.engines.values():
            with contextlib.suppress(Exception):
                ray.kill(handle)
        if self.started_ray:
            ray.shutdown()


def start_cluster(serve_settings, store: str, *, engines: int = 2, address: str | None = None,
                  autosave_every_s: float = 5.0, num_cpus: float = 0, num_gpus: float = 0,
                  ray_init: dict | None = None, **knobs) -> Cluster:
    """Start (or join, with ``address``) Ray, ``engines`` engine actors and the registry."""
    import ray

    from .store import SnapshotStore

    SnapshotStore(store)  # the folder must exist
    started = False
    if not ray.is_initialized():
        options = {"include_dashboard": False, "log_to_driver": False, "namespace": NAMESPACE, **(ray_init or {})}
        if address is not None:
            options = {k: v for k, v in options.items() if k not in ("num_cpus", "object_store_memory")}
        ray.init(address=address, **options)
        started = True
    ids = tuple(f"e{i}" for i in range(engines))
    settings = ClusterSettings(store=str(store), engines=ids, **knobs)
    actor: Any = ray.remote(EngineHost)
    handles = {eid: actor.options(name=engine_actor_name(eid), namespace=NAMESPACE, num_cpus=num_cpus,
                                  num_gpus=num_gpus, max_concurrency=64, max_restarts=-1).remote(
                                      eid, serve_settings, str(store), autosave_every_s)
               for eid in ids}
    ray.get([h.ping.remote() for h in handles.values()], timeout=600)  # each has loaded its model
    with contextlib.suppress(ValueError):  # a registry left by an earlier run of this cluster
        ray.kill(ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE))
        time.sleep(0.5)
    registry: Any = ray.remote(Registry)
    registry = registry.options(name=REGISTRY_NAME, namespace=NAMESPACE, lifetime="detached", max_restarts=-1,
                                max_concurrency=32, num_cpus=0)
    handle = registry.remote(settings)
    ray.get(handle.streams.remote(), timeout=120)
    return Cluster(settings, serve_settings, handles, started)
