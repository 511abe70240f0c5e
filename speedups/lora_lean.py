"""Item 3 without dropout under autocast: autograd's own nodes (`lean_delta`), siblings sharing one matmul.

`lean_delta` is the branch in three aten calls with autograd's C++ backward (`VLM_LORA_LEAN_LORA`); LoRA layers of
one block that read the same input (q / k / v, gate / up) compute their rank-r projections in one matmul
(`SharedInput`, `VLM_LORA_GROUP_LORA`), given to them when item 3's check runs (`group_shared_inputs`).
"""

from __future__ import annotations

import torch

from speedups import lora_switches
from speedups.lora_plain import plain_adapter, plain_linear

# sibling projections that read the same input in the attention and MLP blocks of the models we train
SHARED_INPUT_NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedInput:
    """LoRA layers of one block that read the same input: their rank-r projections in one matmul.

    q, k and v (gate and up) each compute `x A^T` from the same `x`: three narrow matmuls that each
    read the whole input forward, and three more (input gradient, A's gradient) backward, plus the
    adds of three input gradients. The first member called with an input computes `x [A_q; A_k; A_v]^T`
    for every member on the lean path and keeps the other members' column slices; a member called with
    the very same tensor (same object, same version) takes its slice. Backward, autograd then runs one
    matmul for the input's gradient and one for the stacked A's gradient. A member called with another
    input computes alone, and the group turns itself off (the block does not feed them one input).
    """

    def __init__(self, layers) -> None:
        self.layers = tuple(layers)
        self.enabled = True
        self._clear()

    def _clear(self) -> None:
        self.x: torch.Tensor | None = None
        self.version = -1
        self.slices: dict[int, torch.Tensor] = {}

    def rank_input(self, layer, x: torch.Tensor, weight_a: torch.Tensor) -> torch.Tensor:
        """`x A^T` for `layer` (its `weight_a`), from the group's one matmul where it can."""
        if self.enabled and self.x is x and self.version == x._version:
            h = self.slices.pop(id(layer), None)
            if h is not None:
                if not self.slices:
                    self._clear()
                return h
        if self.slices:  # a member did not get the input the others got: not one input here
            self.enabled = False
        self._clear()
        members = self._members(layer, x, weight_a) if self.enabled else []
        if len(members) < 2:
            return torch.nn.functional.linear(x, weight_a)
        weights = [w for _, w in members]
        h_all = torch.nn.functional.linear(x, torch.cat(weights))
        mine = None
        for (member, _), h in zip(members, h_all.split([w.shape[0] for w in weights], dim=-1)):
            if member is layer:
                mine = h
            else:
                self.slices[id(member)] = h
        self.x, self.version = x, x._version
        return mine

    def _members(self, layer, x, weight_a) -> list[tuple[object, torch.Tensor]]:
        """(layer, A) of the members the lean path would take for this input, the caller among them."""
        members = []
        for member in self.layers:
            if member is layer:
                members.append((layer, weight_a))
                continue
            plain = plain_adapter(member, x, (), {})
            if plain is None or plain[3] != 0 or not plain_linear(member.base_layer):
                continue
            other_a = plain[0]
            if other_a.dtype == weight_a.dtype and other_a.shape[1] == weight_a.shape[1]:
                members.append((member, other_a))
        return members


def group_shared_inputs(model: torch.nn.Module) -> int:
    """Gives sibling LoRA layers that read one input (`SHARED_INPUT_NAMES`) a `SharedInput`; how many groups."""
    count = 0
    for module in model.modules():
        for names in SHARED_INPUT_NAMES:
            layers = [getattr(module, n, None) for n in names]
            layers = [m for m in layers if m is not None and hasattr(m, "lora_A") and hasattr(m, "base_layer")]
            if len(layers) < 2 or any(getattr(m, "_vlm_lora_shared_input", None) for m in layers):
                continue
            group = SharedInput(layers)
            for member in layers:
                member._vlm_lora_shared_input = group
            count += 1
    return count


def lean_delta(x, weight, bias, weight_a, weight_b, scaling: float, h: torch.Tensor | None = None):
    """`x W^T + b + scaling * (x A^T) B^T` without dropout, under autocast, in three aten calls.

    No autograd function of ours: the backward is autograd's own nodes, run by its C++ engine (a
    Python `backward` costs the host more than the three matmuls cost the GPU at LoRA's rank, and
    where the host launches kernels more slowly than the GPU runs them that is the step's time).
    `addmm_` puts the scaling and the add in the second matmul's epilogue, in place on the frozen
    layer's output (no copy of it first; `INPLACE`).
    """
    x2 = x.reshape(-1, x.shape[-1])
    base = torch.nn.functional.linear(x2, weight, bias)  # 2-D: a fresh tensor, not a view of one
    h = torch.nn.functional.linear(x2, weight_a) if h is None else h.reshape(-1, h.shape[-1])
    if lora_switches.INPLACE and base.dtype == h.dtype:
        # F.linear's backward does not keep its output, so adding into it in place is safe for autograd
        # and saves the copy an out-of-place addmm makes first; autocast does not cast for in-place ops,
        # so B (rank r: a small kernel) is cast here
        out = base.addmm_(h, weight_b.to(h.dtype).t(), alpha=scaling)
    else:
        out = torch.addmm(base, h, weight_b.t(), alpha=scaling)
    return out.view(*x.shape[:-1], out.shape[-1])
