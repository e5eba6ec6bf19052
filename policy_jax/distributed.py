"""Multi-host start-up and the process-local -> global batch step (TPU pods, multi-node GPU).

On one host both are no-ops: `maybe_initialize_distributed` returns False and
`global_batch_from_local` is a device_put with the batch sharding.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from policy_jax.run_config import DistributedConfig

#: Environment variables that mean "this process is one of several" (JAX's own cluster detection
#: handles TPU pods, SLURM and Open MPI once initialize() is called).
_CLUSTER_ENV = ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE")


def wants_distributed(cfg: DistributedConfig, environ: dict[str, str] | None = None) -> bool:
    """Whether to call jax.distributed.initialize for this config and environment."""
    environ = dict(os.environ if environ is None else environ)
    if cfg.initialize is True:
        return True
    if cfg.initialize is False:
        return False
    if cfg.initialize != "auto":
        raise ValueError(f"distributed.initialize={cfg.initialize!r}: expected true, false or auto")
    if cfg.coordinator_address:
        return True
    tpu_hosts = environ.get("TPU_WORKER_HOSTNAMES", "")
    if "," in tpu_hosts:
        return True
    return any(environ.get(k) for k in _CLUSTER_ENV if k != "TPU_WORKER_HOSTNAMES")


def maybe_initialize_distributed(cfg: DistributedConfig) -> bool:
    """Call jax.distributed.initialize when `cfg` / the environment asks for it. Returns whether it did.

    Must run before anything touches a JAX device.
    """
    if not wants_distributed(cfg):
        return False
    kwargs: dict[str, Any] = {}
    if cfg.coordinator_address:
        kwargs["coordinator_address"] = cfg.coordinator_address
    if cfg.num_processes is not None:
        kwargs["num_processes"] = cfg.num_processes
    if cfg.process_id is not None:
        kwargs["process_id"] = cfg.process_id
    jax.distributed.initialize(**kwargs)
    return True


def global_batch_from_local(local_tree: Any, sharding_for: Any) -> Any:
    """Assemble each process's slice of a batch into global arrays.

    `local_tree`: numpy arrays holding this process's rows (its share of the global batch);
    `sharding_for(ndim) -> NamedSharding` gives the batch sharding. On one process this is the
    whole batch.
    """

    def to_global(x):
        x = np.asarray(x)
        sharding: NamedSharding = sharding_for(x.ndim)
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree.map(to_global, local_tree)
