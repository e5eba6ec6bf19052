"""Creating a sharded model: the eager path (the whole model on one device, then each parameter moved
to its shards) and the jitted path (each parameter made in its shards) give the same values as a
plain eager construction, in the shardings the parameters' logical axes ask for."""

import jax
import numpy as np
from flax import nnx

from policy_jax.run_config import load_run_config
from policy_jax.sharding import MeshConfig, init_sharded, iter_variables, make_mesh, variable_sharding
from policy_jax.transformer import CausalLM

CFG = load_run_config("configs/tiny.yaml")


def test_both_creation_paths_match_a_plain_construction_in_the_asked_shardings():
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    plain = {path: np.asarray(var.get_value()) for path, var in iter_variables(CausalLM(CFG.model, rngs=nnx.Rngs(3)))}
    for fraction in (0.25, 0.0):  # 0: the model never fits on one device, so it is made in its shards
        model = init_sharded(lambda: CausalLM(CFG.model, rngs=nnx.Rngs(3)), mesh, whole_fraction=fraction)
        split = 0
        for path, var in iter_variables(model):
            value = var.get_value()
            assert value.sharding.is_equivalent_to(variable_sharding(var, mesh), value.ndim), (fraction, path)
            got = np.asarray(jax.device_get(value))
            if fraction:  # the same eager computation, only moved
                np.testing.assert_array_equal(got, plain[path], err_msg=str(path))
            else:  # compiled: the same random bits, the scaling fused (an ulp apart)
                np.testing.assert_allclose(got, plain[path], rtol=1e-6, atol=1e-9, err_msg=str(path))
            split += len(value.sharding.device_set) > 1 and not value.sharding.is_fully_replicated
        assert split > 0, fraction  # the weights are spread over the mesh, not replicated
