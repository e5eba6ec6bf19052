"""The float32 LM head on hardware whose fast matrix units take bf16.

At XLA's default precision a float32 matrix product is one bf16 pass on a TPU and TF32 on an NVIDIA
GPU, both of which round float32 operands to about 8 or 11 significant bits. The float32 head must
not: it exists so that the trainer's log-probabilities see the float32 master weights. With bf16
hidden states (bf16 compute) the weights are split into three bf16 parts; each product of two bf16
values is exact in float32, so one bf16 product three times as deep, with float32 accumulation,
gives the float32 product.
Otherwise the product asks for the highest precision.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bf16_parts(x: jax.Array, parts: int) -> list[jax.Array]:
    """x as `parts` bf16 arrays, largest first, whose float32 sum approaches x: each part holds the next 8
    significant bits of what the ones before it left, so three hold all 24 bits of a float32."""
    out, rest = [], x.astype(jnp.float32)
    for _ in range(parts):
        out.append(rest.astype(jnp.bfloat16))
        rest = rest - out[-1].astype(jnp.float32)
    return out


def _sum_of_products(spec: str, pairs) -> jax.Array:
    """The sum of einsum(spec, a, b) over bf16 pairs (largest first), float32 accumulation, smallest added
    first: for the gradients, whose outputs ([b, c, d] and [d, v]) are small."""
    total = None
    for a, b in reversed(pairs):
        term = jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
        total = term if total is None else total + term
    return total


@jax.custom_vjp
def exact_head_logits(hidden_bcd: jax.Array, head_dv: jax.Array) -> jax.Array:
    """hidden [b, c, d] (bf16) @ head [d, v] (float32) -> [b, c, v] float32, every product exact.

    A bf16 times a bf16 has at most 16 significant bits, so it is exact in float32; with the head split
    into three bf16 parts, one product of the hidden states repeated three times along d with the parts
    stacked along d accumulates, in float32, what a float32 matrix product does. One product rather
    than three summed keeps a single [b, c, v] float32 buffer. The gradient of the head takes the
    cotangent in two bf16 parts (16 significant bits), the hidden states' gradient (returned in bf16)
    three cross terms."""
    parts = bf16_parts(head_dv, 3)
    return jnp.einsum("bck,kv->bcv", jnp.concatenate([hidden_bcd] * len(parts), axis=-1),
                      jnp.concatenate(parts, axis=0), preferred_element_type=jnp.float32)


def _exact_head_forward(hidden_bcd, head_dv):
    return exact_head_logits(hidden_bcd, head_dv), (hidden_bcd, head_dv)


def _exact_head_backward(residuals, ct_bcv):
    hidden_bcd, head_dv = residuals
    c_hi, c_lo = bf16_parts(ct_bcv, 2)
    w_hi, w_mid = bf16_parts(head_dv, 2)
    d_hidden = _sum_of_products("bcv,dv->bcd", [(c_hi, w_hi), (c_lo, w_hi), (c_hi, w_mid)])
    d_head = _sum_of_products("bcd,bcv->dv", [(hidden_bcd, c_hi), (hidden_bcd, c_lo)])
    return d_hidden.astype(hidden_bcd.dtype), d_head.astype(head_dv.dtype)


exact_head_logits.defvjp(_exact_head_forward, _exact_head_backward)


def float32_logits(hidden_bcd: jax.Array, head_dv: jax.Array) -> jax.Array:
    """hidden [b, c, d] @ head [d, v] -> [b, c, v] float32 as a float32 product: exact bf16 passes for bf16
    hidden states, the highest precision otherwise (never TF32 or one bf16 pass)."""
    if hidden_bcd.dtype == jnp.bfloat16:
        return exact_head_logits(hidden_bcd, head_dv.astype(jnp.float32))
    return jnp.einsum("bcd,dv->bcv", hidden_bcd.astype(jnp.float32), head_dv.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
