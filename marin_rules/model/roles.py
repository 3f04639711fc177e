"""What each parameter of the model is for: its role, declared by name, never guessed.

Model: every `nnx.Param` of `MoETransformer` has an attribute name (the last name of
its path in `nnx.state(model)`; the router's weight is `router.w`), and `ROLES` maps
each such name to one role:

- `embedding`: the token embedding (also the output head when tied);
- `head`: the untied output head;
- `matrix`: a hidden projection [in, out] (attention, dense SwiGLU, shared expert)
  or a stack of expert projections [E, in, out];
- `norm`: an RMSNorm scale;
- `router`: the router's logits matrix.

Optimizers and weight decay choose by role (`train/optim.py`). A parameter whose name
is not in `ROLES` is refused (`param_roles` raises) instead of falling into some
default group: adding a weight to the model means adding its role here.
"""

from __future__ import annotations

from typing import Any

import jax

from marin_rules.model.sharding import path_names

EMBEDDING, HEAD, MATRIX, NORM, ROUTER = "embedding", "head", "matrix", "norm", "router"

ROLES = {
    "embed": EMBEDDING,
    "head": HEAD,
    "scale": NORM,
    "router.w": ROUTER,
    "w_q": MATRIX,
    "w_k": MATRIX,
    "w_v": MATRIX,
    "w_o": MATRIX,
    "w_gate": MATRIX,
    "w_up": MATRIX,
    "w_down": MATRIX,
}


def role_of(path: tuple) -> str:
    """The role of the parameter at pytree `path` (see the module docstring)."""
    names = path_names(path)
    for key in (".".join(names[-2:]), names[-1] if names else ""):
        if key in ROLES:
            return ROLES[key]
    raise ValueError(
        f"parameter {'/'.join(names)} has no role; add its name to ROLES in marin_rules/model/roles.py"
    )


def param_roles(params: Any) -> Any:
    """A pytree shaped like `params` (the model's `nnx.Param` state) of role names."""
    return jax.tree_util.tree_map_with_path(lambda path, _: role_of(path), params)
