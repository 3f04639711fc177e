"""The mixture-of-experts language model.

This package's top level stays JAX-free (experiment checkers import the config):
`config.py` (ModelConfig) and `flops.py` (parameter/FLOP counts) import no JAX;
`transformer.py` (MoETransformer, loss_and_aux, update_router_bias), `router.py`,
`moe.py` (dispatch backends), `sharding.py` (mesh, partition specs), `roles.py`
(each parameter's declared role, which the optimizer groups by) and `peak.py` (the
measured matmul ceiling MFU is computed against) do.
"""

from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import active_params, flops_per_token, total_params

__all__ = ["ModelConfig", "active_params", "flops_per_token", "total_params"]
