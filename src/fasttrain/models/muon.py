"""Muon for the hidden weight matrices, AdamW for every other parameter, as one torch optimizer.

Muon (Jordan et al. 2024; torch.optim.Muon) replaces each matrix's momentum by its nearest
orthogonal matrix (a few Newton-Schulz steps) before the update: every direction of the matrix
moves at the same rate. It is made for the 2-D weights of hidden layers; the input embedding, the
output layer, gains and biases are left to AdamW, as its authors prescribe.

One optimizer object holds both, each on its own parameter groups with its own lr, so whatever
takes one optimizer takes this one unchanged: Lightning's automatic optimization and gradient
clipping, GradScaler, lr scaling (every group by the same factor), every scheduler (each group's
lr, initial_lr included), the checkpoint's optimizer state and its resume.

Which matrices are hidden is the net's structure, not something the optimizer can tell from
tensors: the task marks them (`mark_hidden_matrices`, from models.optim_plan) before it
builds the optimizer. Hidden: the 2-D weights of every nn.Linear but the net's last one (its
output layer), shared with no embedding. A GPT's are the attention and MLP matrices of its
blocks; a conv net's filters (4-D) are not, so a net of conv layers and one output layer has none
and model/optimizer=muon is refused for it when the task is built.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Annotated, Any, ClassVar

import torch
from torch import nn

from fasttrain.config.domains import LearningRate, NonNegative, Positive, Range, check_arguments
from fasttrain.config.errors import UserError
from fasttrain.models.protocols import takes_hidden_matrices

MUON_KEY = "muon"  # a param group's key: True for the groups Muon updates


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon on the groups marked `muon: True`, torch.optim.AdamW on the others.

    Args:
        params: parameters or param groups; the task marks the hidden matrices' groups.
        lr: Muon's learning rate (model.optimizer.lr: what lr_scaling and the LR finder set).
        momentum, nesterov, ns_steps, adjust_lr_fn: Muon's (see torch.optim.Muon).
        adamw_lr: AdamW's learning rate, for embeddings, the output layer, gains and biases.
        betas, eps, fused: AdamW's.
        weight_decay: decoupled, for both (lr x weight_decay a step); a group's own value
            (a language model's: matrices only) wins.
    """

    # Read by fasttrain.models.optim_plan: mark the hidden matrices' groups before building this.
    takes_hidden_matrices: ClassVar[bool] = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: Annotated[float, LearningRate] = 0.02,
        momentum: Annotated[float, NonNegative] = 0.95,
        nesterov: bool = True,
        ns_steps: Annotated[int, Range(1, 99)] = 5,
        adjust_lr_fn: str | None = None,
        adamw_lr: Annotated[float, LearningRate] = 0.003,
        betas: Annotated[tuple[float, float], Range(0, 1, high_open=True)] = (0.9, 0.95),
        eps: Annotated[float, Positive] = 1e-8,
        weight_decay: Annotated[float, NonNegative] = 0.0,
        fused: bool | None = None,
    ) -> None:
        # What torch.optim.Muon checks only once it has matrices (the config check builds this
        # optimizer on one 1-D parameter), and AdamW's lr, said as the argument's domain.
        check_arguments(MuonWithAdamW.__init__, locals())
        _check_adjust_lr_fn(adjust_lr_fn)
        groups = _as_groups(params)
        hidden = [g for g in groups if g.get(MUON_KEY)]
        rest = [{**g, MUON_KEY: False} for g in groups if not g.get(MUON_KEY)]
        # The inner optimizers take these very dicts: a scheduler's lr on one of this
        # optimizer's groups is the inner optimizer's lr.
        self.muon = None
        if hidden:
            self.muon = torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay,
                                         momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                                         adjust_lr_fn=adjust_lr_fn)  # fmt: skip
        self.adamw = None
        if rest:
            adam_betas = (float(betas[0]), float(betas[1]))  # a ListConfig from the yaml
            self.adamw = torch.optim.AdamW(rest, lr=adamw_lr, betas=adam_betas, eps=eps,
                                           weight_decay=weight_decay, fused=fused)  # fmt: skip
        inner = [o for o in (self.muon, self.adamw) if o is not None]
        super().__init__([g for o in inner for g in o.param_groups],
                         {"lr": lr, "weight_decay": weight_decay})  # fmt: skip
        self._share_state()

    def _share_state(self) -> None:
        """The inner optimizers on this one's groups and per-parameter state (the dicts that
        load_state_dict replaces): a checkpoint, a move to the device, a scheduler see it all."""
        if self.muon is not None:
            self.muon.param_groups = [g for g in self.param_groups if g[MUON_KEY]]
            self.muon.state = self.state
        if self.adamw is not None:
            self.adamw.param_groups = [g for g in self.param_groups if not g[MUON_KEY]]
            self.adamw.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share_state()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.muon is not None:
            device = self.muon.param_groups[0]["params"][0].device
            slow_bf16 = device.type == "cpu" and not _cpu_multiplies_bf16_fast()
            with newton_schulz_in_float32() if slow_bf16 else nullcontext():
                self.muon.step()
        if self.adamw is not None:
            self.adamw.step()
        return loss


def _float32_newton_schulz(
    grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> torch.Tensor:
    """torch.optim.Muon's orthogonalisation (torch.optim._muon._zeropower_via_newtonschulz: the
    same quintic Newton-Schulz steps) in float32 instead of bfloat16. A CPU without bf16 matrix
    instructions (AVX2: many AMD EPYCs, most laptops) emulates bf16 products: there torch's runs
    ~10x slower than float32 (the tiny GPT's 16 hidden matrices, 5 steps: 945 ms against 104 ms
    on one core of an AVX2 EPYC, about the rest of the training step's time)."""
    a, b, c = ns_coefficients
    wide = grad.size(0) > grad.size(1)
    x = grad.float().T if wide else grad.float()  # [rows <= cols]: the smaller Gram matrix
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    if x.size(0) >= 64 and x.size(1) >= 2 * x.size(0):  # below 64 rows the calls cost more
        x = _gram_newton_schulz(x, a, b, c, ns_steps)
        return x.T if wide else x
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if wide else x


def _gram_newton_schulz(x: torch.Tensor, a: float, b: float, c: float, steps: int) -> torch.Tensor:
    """The same steps on x [m, n], n >= 2m, carried out on m x m matrices. Each step is
    x <- p(x x^T) x with p(g) = a + b g + c g^2, so after k steps x_k = q_k x_0 with q_k a
    polynomial in g_0 = x_0 x_0^T, and x_k x_k^T = q_k^2 g_0 =: g_k. The loop keeps q and g:
    p = p(g), q <- p q, g <- p g p, then x_0 is multiplied once at the end. Per step 6m^3
    multiply-adds where the plain loop's take 2m^2 n + m^3: the tiny GPT's [128, 512] matrices
    in 0.59x the plain loop's time, [128, 384] in 0.69x (one core of an AVX2 EPYC). The same
    values up to float32 rounding, which the loop on m x m matrices grows more: against a float64
    run, 2.4e-4 relative at most (the plain loop: 8e-6; torch's own, in bf16: ~1e-2), on
    matrices of condition number 1e2 to 1e8."""
    gram = x @ x.T
    eye = torch.eye(gram.size(0), dtype=gram.dtype, device=gram.device)
    q: torch.Tensor | None = None
    for step in range(steps):
        p = torch.addmm(torch.add(eye, gram, alpha=b / a).mul_(a), gram, gram, alpha=c)
        q = p if q is None else p @ q
        if step < steps - 1:
            gram = p @ gram @ p
    return x if q is None else q @ x


@contextmanager
def newton_schulz_in_float32() -> Iterator[None]:
    """torch.optim.Muon's steps inside orthogonalise in float32 (_float32_newton_schulz).
    Private: torch.optim.Muon takes no dtype for its Newton-Schulz steps, so the module function
    its step calls is swapped for the step's length; tests/test_gpt_modern.py fails if torch no
    longer calls it."""
    import torch.optim._muon as muon_impl

    torch_own = muon_impl._zeropower_via_newtonschulz
    muon_impl._zeropower_via_newtonschulz = _float32_newton_schulz
    try:
        yield
    finally:
        muon_impl._zeropower_via_newtonschulz = torch_own


@functools.cache
def _cpu_multiplies_bf16_fast() -> bool:
    """Whether torch's CPU kernels here are an AVX512 build, whose bf16 matrix products are
    fast (2x float32's on an AVX512-BF16 Xeon): there, and on a GPU, torch's own bf16 steps.
    On AVX2 and others they are emulated (10x slower than float32)."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _check_adjust_lr_fn(adjust_lr_fn: str | None) -> None:
    valid = ("original", "match_rms_adamw", "spectral_unclamped")
    if adjust_lr_fn is not None and adjust_lr_fn not in valid:
        raise ValueError(f"expected null or one of {', '.join(valid)}, not {adjust_lr_fn!r}")


def _as_groups(params: Iterable[Any]) -> list[dict[str, Any]]:
    items = list(params)
    if items and not isinstance(items[0], dict):
        return [{"params": items}]
    return [dict(g) for g in items]


def hidden_matrices(net: nn.Module) -> list[nn.Parameter]:
    """The 2-D weights of the net's nn.Linear layers but its last one (the output layer), none
    shared with an embedding (a tied output layer)."""
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)][:-1]
    embedded = {id(m.weight) for m in net.modules() if isinstance(m, nn.Embedding)}
    return [m.weight for m in linears  # type: ignore[misc]  # Linear.weight is a Parameter
            if m.weight.dim() == 2 and m.weight.requires_grad
            and id(m.weight) not in embedded]  # fmt: skip


def mark_hidden_matrices(groups: Iterable[Any], net: nn.Module) -> list[dict[str, Any]]:
    """Param groups (or parameters) -> the same groups with the hidden matrices split off into
    groups of their own, marked `muon: True` (their other options kept: weight decay)."""
    hidden = {id(p) for p in hidden_matrices(net)}
    marked = []
    for group in _as_groups(groups):
        params = list(group["params"])
        for muon in (True, False):
            part = [p for p in params if (id(p) in hidden) == muon]
            if part:
                marked.append({**group, "params": part, MUON_KEY: muon})
    return marked


def check_net_has_hidden_matrices(factory: Any, net: nn.Module) -> None:
    """Refuse, when the task is built (before a run writes anything), Muon on a net without
    hidden matrices: it would train nothing with Muon, all with AdamW."""
    if not takes_hidden_matrices(factory) or hidden_matrices(net):
        return
    raise UserError(
        f"model.optimizer: Muon (model/optimizer=muon) updates the 2-D weights of hidden Linear "
        f"layers, and {type(net).__name__} has none (conv filters, an output layer); "
        "model/optimizer=adamw or sgd, or a net with hidden Linear layers (model/net=mlp, "
        "model=gpt_modern)"
    )
