"""Neural Interpreters (Rahaman et al., 2021), from the inside out (NI §2): a
:class:`~modnets.nn.loc.LOC` (NI eqs. 9-10); the :class:`Interpreter`, ``n_l`` LOCs pooled back by
compatibility (NI eq. 11); a :class:`FunctionIteration`, type matching then the interpreter
(NI eqs. 12-13); a :class:`Script`, functions ``(s_u, c_u)`` and ``n_i`` iterations sharing all
parameters (NI eq. 14); the :class:`NeuralInterpreter`, tokeniser, CLS tokens, ``n_s`` scripts and heads
(NI eq. 1). All function streams live in one ``(batch, functions, tokens, dim)`` tensor: no
Python loop over functions or heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from modnets.nn.loc import LOC
from modnets.nn.tokens import ClassTokenModel, ClassTokens, Heads, make_tokenizer
from modnets.nn.type_matching import TypeInference, TypeMatching, random_signatures
from modnets.pretrained import Pretrained
from modnets.probes import probe
from modnets.utils import check_input, positive_int

__all__ = [
    "NIConfig",
    "NIOutput",
    "Interpreter",
    "FunctionIteration",
    "Script",
    "NeuralInterpreter",
]

RESIDUALS = ("delta", "literal", "gating", "none")
INPUT_KINDS = ("image", "vector")
POSITIONALS = ("absolute", "relative")


@dataclass
class NIConfig:
    """Hyper-parameters of a :class:`NeuralInterpreter` (validated on construction).

    Defaults follow the public NI digits preset: dim 192, type dim 24, 5 functions, 8 function
    iterations, 1 script, 1 LOC, 4 heads, truncation 1.42, 4x4 patches of 32x32 images.

    Model:
        dim: token width ``d``. code_dim: ``d_code`` (default ``dim``). type_dim: ``d_type``.
        type_hidden: width of the type-inference MLP (default ``dim``).
        num_functions: ``U`` per script. num_scripts: ``n_s``. num_iterations: ``n_i``.
        num_locs: ``n_l`` LOCs per interpreter. num_heads: attention heads (must divide ``dim``).
        mlp_hidden, mlp_layers: the ModMLP of each LOC (hidden default ``dim``).
        truncation: ``tau`` in (0, 2]. sigma: initial kernel bandwidth. eps: NI's epsilon.
        learn_signatures: train the signatures (default: fixed at init, NI §2 "collapse").
        straight_through: straight-through truncation of the kernel (public code's option).
        residual: how NI eq. 11 pools the streams; see :class:`Interpreter`.

    Input and output:
        input_kind: ``"image"`` (patches) or ``"vector"`` (one token per element).
        image_size, patch_size, in_channels: for images.
        positional: ``"absolute"`` (learned position embeddings added to the patch tokens) or
            ``"relative"`` (images only: a learned bias on every attention logit between two
            patches, from their offset on the grid, NI §4.2; see :mod:`modnets.nn.relpos`).
        num_elements, element_features: for vectors.
        num_cls: CLS tokens. num_outputs: outputs per CLS token. shared_head: one head for all.

    Switches to the public code (book/fidelity.md): qk_bias (``False``: no query or key bias, as
    the public code; NI eq. 4's ModLin has one); cls_std (the CLS tokens' std; public: 1).
    """

    dim: int = 192
    code_dim: int | None = None
    type_dim: int = 24
    type_hidden: int | None = None
    num_functions: int = 5
    num_scripts: int = 1
    num_iterations: int = 8
    num_locs: int = 1
    num_heads: int = 4
    mlp_hidden: int | None = None
    mlp_layers: int = 2
    truncation: float = 1.42
    sigma: float = 1.0
    eps: float = 1e-6
    learn_signatures: bool = False
    straight_through: bool = False
    residual: str = "delta"
    input_kind: str = "image"
    image_size: int = 32
    patch_size: int = 4
    in_channels: int = 3
    positional: str = "absolute"
    num_elements: int = 5
    element_features: int = 1
    num_cls: int = 1
    num_outputs: int = 10
    shared_head: bool = False
    qk_bias: bool = True
    cls_std: float = 0.02

    def __post_init__(self) -> None:
        if self.code_dim is None:
            self.code_dim = self.dim
        if self.type_hidden is None:
            self.type_hidden = self.dim
        if self.mlp_hidden is None:
            self.mlp_hidden = self.dim
        self.validate()

    def validate(self) -> None:
        for name in (
            "dim",
            "code_dim",
            "type_dim",
            "type_hidden",
            "num_functions",
            "num_scripts",
            "num_iterations",
            "num_locs",
            "num_heads",
            "mlp_hidden",
            "mlp_layers",
            "num_cls",
            "num_outputs",
        ):
            positive_int(getattr(self, name), name)
        if self.dim % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        if self.type_dim < 2:
            raise ValueError(f"type_dim must be at least 2 (a sphere), got {self.type_dim}")
        if not 0.0 < float(self.truncation) <= 2.0:
            raise ValueError(f"truncation (tau) must lie in (0, 2], got {self.truncation}")
        if not float(self.sigma) > 0.0:
            raise ValueError(f"sigma must be positive, got {self.sigma}")
        if not float(self.eps) >= 0.0:
            raise ValueError(f"eps must be non-negative, got {self.eps}")
        if not isinstance(self.qk_bias, bool):
            raise TypeError(f"qk_bias must be True or False, got {self.qk_bias!r}")
        if not 0.0 < float(self.cls_std) < math.inf:
            raise ValueError(f"cls_std must be positive and finite, got {self.cls_std}")
        if self.residual not in RESIDUALS:
            raise ValueError(f"residual must be one of {RESIDUALS}, got {self.residual!r}")
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(f"input_kind must be one of {INPUT_KINDS}, got {self.input_kind!r}")
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional must be one of {POSITIONALS}, got {self.positional!r}")
        if self.positional == "relative" and self.input_kind != "image":
            raise ValueError("positional='relative' needs input_kind='image' (a grid of patches)")
        if self.input_kind == "image":
            for name in ("image_size", "patch_size", "in_channels"):
                positive_int(getattr(self, name), name)
            if self.image_size % self.patch_size:
                raise ValueError(
                    f"patch_size={self.patch_size} must divide image_size={self.image_size}"
                )
        else:
            for name in ("num_elements", "element_features"):
                positive_int(getattr(self, name), name)

    def replace(self, **changes) -> NIConfig:
        """A copy with some fields changed (validated again)."""
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown NIConfig fields {sorted(unknown)}")
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return NIConfig(**{**values, **changes})


@dataclass
class NIOutput:
    """What :meth:`NeuralInterpreter.forward` returns with ``return_routing=True``: ``logits``
    ``(B, num_cls, num_outputs)``; per script, ``compatibilities`` ``C`` of every function
    iteration, ``(B, n_i, U, T)``, CLS tokens first (NI Fig. 3's paths), and ``types``
    ``(B, n_i, T, d_type)`` (NI Fig. 4)."""

    logits: Tensor
    compatibilities: list[Tensor]
    types: list[Tensor]


class Interpreter(nn.Module):
    """``n_l`` LOCs over the function streams, pooled back by compatibility (NI eq. 11).

    NI eq. 11 read literally, ``y_i = x_i + sum_u C_ui LOCs(x)_ui``, doubles a matched token at
    every function iteration, since each LOC carries a residual (``LOCs(x)_ui = x_i + delta_ui``):
    8 iterations scale it by up to 256 (chapter 4). By default (``residual="delta"``) we pool the
    *updates*, ``y_i = x_i + sum_u C_ui (LOCs(x)_ui - x_i)``, which keeps what the paper derives
    from NI eq. 11 (``C_ui = 0`` for all ``u`` gives ``y_i = x_i``; nothing depends on the number
    of functions). ``"literal"``: NI eq. 11 as printed; ``"gating"``: the public default,
    ``(1 - mean_u C_ui) x_i + mean_u C_ui * sum_u C_ui LOCs(x)_ui``; ``"none"``: the public digits
    preset, ``sum_u C_ui LOCs(x)_ui`` (a token no function matches becomes zero).

    Shapes: x ``(B, T, d)``, codes ``(U, d_code)``, compat ``(B, U, T)`` -> ``(B, T, d)``.
    """

    def __init__(
        self,
        dim: int,
        code_dim: int,
        *,
        num_locs: int = 1,
        num_heads: int = 4,
        mlp_hidden: int | None = None,
        mlp_layers: int = 2,
        eps: float = 1e-6,
        residual: str = "delta",
        relative_grid: int | None = None,
        qk_bias: bool = True,
    ):
        super().__init__()
        if residual not in RESIDUALS:
            raise ValueError(f"residual must be one of {RESIDUALS}, got {residual!r}")
        self.residual = residual
        loc = dict(
            num_heads=num_heads,
            mlp_hidden=mlp_hidden,
            mlp_layers=mlp_layers,
            eps=eps,
            qk_bias=qk_bias,
        )
        self.locs = nn.ModuleList(
            LOC(dim, code_dim, **loc, relative_grid=relative_grid) for _ in range(num_locs)
        )

    def forward(self, x: Tensor, codes: Tensor, compat: Tensor) -> Tensor:
        B, T, d = x.shape
        streams = x[:, None].expand(B, codes.shape[0], T, d)  # broadcast, no copy
        for loc in self.locs:
            streams = loc(streams, codes, compat)
        if self.residual == "delta":
            streams = streams - x[:, None]
        # sum_u C_ui * stream_ui as a broadcast product and a reduction: einsum lowers this to a
        # batched (1 x U) @ (U x d) matmul per token, which is several times slower on CPU.
        pooled = (compat[..., None] * streams).sum(dim=1)
        if self.residual == "gating":
            gate = compat.mean(dim=1)[..., None]
            return (1 - gate) * x + gate * pooled
        if self.residual == "none":
            return pooled
        # NI eq. 11
        return x + pooled


class FunctionIteration(nn.Module):
    """Type matching, then the interpreter (NI eqs. 12-13). Shared by all iterations of a script.

    Shapes: x ``(B, T, d)``, signatures ``(U, d_type)`` (unit norm), codes ``(U, d_code)`` ->
    ``(y (B, T, d), C (B, U, T), types (B, T, d_type))``.
    """

    def __init__(self, config: NIConfig):
        super().__init__()
        c = config
        self.type_inference = TypeInference(c.dim, c.type_dim, c.type_hidden)
        self.type_matching = TypeMatching(
            truncation=c.truncation, sigma=c.sigma, eps=c.eps, straight_through=c.straight_through
        )
        self.interpreter = Interpreter(
            c.dim,
            c.code_dim,
            num_locs=c.num_locs,
            num_heads=c.num_heads,
            mlp_hidden=c.mlp_hidden,
            mlp_layers=c.mlp_layers,
            eps=c.eps,
            residual=c.residual,
            relative_grid=c.image_size // c.patch_size if c.positional == "relative" else None,
            qk_bias=c.qk_bias,
        )

    def forward(
        self, x: Tensor, signatures: Tensor, codes: Tensor, function_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        types = self.type_inference(x)
        compat = self.type_matching(types, signatures, function_mask)
        probe("ni.types", types)
        probe("ni.compatibility", compat)
        return self.interpreter(x, codes, compat), compat, types


class Script(nn.Module):
    """A set of functions and ``n_i`` recurrent function iterations (NI eq. 14).

    Functions are rows of ``signatures`` (unit vectors, fixed unless ``learn_signatures``) and
    ``codes``, the only tensors that depend on the number of functions, stored as chunks so that
    functions added later can train while the old ones stay frozen (:meth:`add_functions`).

    Shapes: x ``(B, T, d)`` -> ``(B, T, d)``.
    """

    def __init__(self, config: NIConfig):
        super().__init__()
        self.config = config
        self.num_iterations = config.num_iterations
        self.iteration = FunctionIteration(config)
        self.signature_chunks = nn.ParameterList()
        self.code_chunks = nn.ParameterList()
        self._append_functions(config.num_functions, trainable=True)
        self.register_buffer("function_mask", torch.ones(config.num_functions, dtype=torch.bool))

    def _append_functions(self, n: int, trainable: bool, device=None, dtype=None) -> None:
        c = self.config
        sig = nn.Parameter(random_signatures(n, c.type_dim).to(device, dtype))
        sig.requires_grad_(trainable and c.learn_signatures)
        code = nn.Parameter(torch.randn(n, c.code_dim).to(device, dtype))
        code.requires_grad_(trainable)
        self.signature_chunks.append(sig)
        self.code_chunks.append(code)

    @property
    def num_functions(self) -> int:
        return sum(s.shape[0] for s in self.signature_chunks)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # functions may sit in other chunks than here (added, frozen or removed after the save):
        # load them by row, whatever the chunks, by splitting the saved rows as this model does
        for name in ("signature_chunks", "code_chunks"):
            saved = [k for k in state_dict if k.startswith(f"{prefix}{name}.")]
            keys = sorted(saved, key=lambda k: int(k.rsplit(".", 1)[1]))
            rows = torch.cat([state_dict.pop(k) for k in keys]) if keys else None
            if rows is not None:
                sizes = [p.shape[0] for p in getattr(self, name)]
                if rows.shape[0] == sum(sizes):
                    for i, part in enumerate(rows.split(sizes)):
                        state_dict[f"{prefix}{name}.{i}"] = part
                else:  # a shape error names the saved count
                    state_dict[f"{prefix}{name}.0"] = rows
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def signatures(self) -> Tensor:
        """``(U, d_type)``, renormalised so that trained signatures stay on the sphere."""
        return nn.functional.normalize(torch.cat(list(self.signature_chunks)), dim=-1)

    @property
    def codes(self) -> Tensor:
        """``(U, d_code)``."""
        return torch.cat(list(self.code_chunks))

    def _mask(self, function_mask: Tensor | None) -> Tensor:
        mask = self.function_mask if function_mask is None else function_mask
        if mask.shape != (self.num_functions,):
            raise ValueError(
                f"function_mask must have shape ({self.num_functions},), got {tuple(mask.shape)}"
            )
        # always the tensor, never "None when all active": reading its values would break a
        # torch.compile graph, and an all-True mask changes nothing (keep & True)
        mask = mask.to(torch.bool)
        if function_mask is not None and not torch.compiler.is_compiling() and not mask.any():
            raise ValueError("function_mask switches every function off: keep at least one")
        return mask

    def forward(
        self,
        x: Tensor,
        num_iterations: int | None = None,
        function_mask: Tensor | None = None,
        return_routing: bool = False,
    ):
        """Apply ``num_iterations`` function iterations (default ``n_i``; any number works at
        inference, NI Fig. 8). With ``return_routing`` also return ``C`` ``(B, n, U, T)`` and the
        types ``(B, n, T, d_type)`` of every iteration."""
        n = self.num_iterations if num_iterations is None else num_iterations
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"num_iterations must be a non-negative int, got {n!r}")
        mask = self._mask(function_mask)
        signatures, codes = self.signatures, self.codes
        compats, types = [], []
        for _ in range(n):  # iterations are sequential by definition (NI eq. 14)
            x, compat, t = self.iteration(x, signatures, codes, mask)
            if return_routing:
                compats.append(compat)
                types.append(t)
        if not return_routing:
            return x
        if n == 0:
            (B, T), (U, dt) = x.shape[:2], signatures.shape
            return x, x.new_zeros(B, 0, U, T), x.new_zeros(B, 0, T, dt)
        return x, torch.stack(compats, dim=1), torch.stack(types, dim=1)

    @torch.no_grad()
    def add_functions(self, n: int, freeze_existing: bool = False, active: bool = True) -> None:
        """Add ``n`` functions with fresh random signatures and codes (NI Fig. 5b).

        ``freeze_existing`` stops gradients to the existing functions' signatures and codes (the
        rest of the model is the caller's to freeze). ``active=False`` adds them masked off.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if freeze_existing:
            for p in [*self.signature_chunks, *self.code_chunks]:
                p.requires_grad_(False)
        device, dtype = self.code_chunks[0].device, self.code_chunks[0].dtype  # e.g. after .half()
        self._append_functions(n, trainable=True, device=device, dtype=dtype)
        new = torch.full((n,), bool(active), dtype=torch.bool, device=device)
        self.function_mask = torch.cat([self.function_mask, new])

    @torch.no_grad()
    def remove_functions(self, indices) -> None:
        """Remove functions by index (NI Fig. 5c). Equivalent to masking them off."""
        idx = torch.as_tensor(indices, dtype=torch.long).flatten()
        U = self.num_functions
        if idx.numel() and (idx.min() < 0 or idx.max() >= U):
            raise ValueError(f"indices must lie in [0, {U}), got {idx.tolist()}")
        keep = torch.ones(U, dtype=torch.bool)
        keep[idx] = False
        if not keep.any():
            raise ValueError("cannot remove every function of a script")
        start, sigs, codes = 0, [], []
        for s, c in zip(self.signature_chunks, self.code_chunks, strict=True):
            k = keep[start : start + s.shape[0]].to(s.device)
            start += s.shape[0]
            if k.any():
                sigs.append(nn.Parameter(s.data[k].clone(), requires_grad=s.requires_grad))
                codes.append(nn.Parameter(c.data[k].clone(), requires_grad=c.requires_grad))
        self.signature_chunks = nn.ParameterList(sigs)
        self.code_chunks = nn.ParameterList(codes)
        self.function_mask = self.function_mask[keep.to(self.function_mask.device)]


class NeuralInterpreter(ClassTokenModel, Pretrained):
    """The Neural Interpreter of NI eq. 1: tokens and CLS tokens through ``n_s`` scripts.

    Shapes: images ``(B, C, H, W)`` or vectors ``(B, n[, f])`` -> logits ``(B, num_cls, num_outputs)``.

    ``forward(x, num_iterations=..., function_mask=..., return_routing=...)``: override the number
    of function iterations (an int, or one per script) for anytime inference (NI Fig. 8); mask
    functions (a ``(U,)`` bool tensor, or one per script) for dropping them at test time; return an
    :class:`NIOutput` with the compatibilities and types of every iteration.
    """

    def __init__(self, config: NIConfig):
        super().__init__()
        if not isinstance(config, NIConfig):
            raise TypeError(f"config must be an NIConfig, got {type(config).__name__}")
        config.validate()
        self.config = config
        self.tokenizer = make_tokenizer(config)
        self.cls = ClassTokens(config.num_cls, config.dim, std=config.cls_std)
        self.scripts = nn.ModuleList(Script(config) for _ in range(config.num_scripts))
        self.heads = Heads(config.num_cls, config.dim, config.num_outputs, config.shared_head)

    def arguments(self) -> dict:
        return {"config": self.config}

    def _per_script(self, value, name: str) -> list:
        if isinstance(value, list | tuple):
            if len(value) != len(self.scripts):
                raise ValueError(f"{name} needs one entry per script ({len(self.scripts)})")
            return list(value)
        return [value] * len(self.scripts)

    def forward(
        self,
        x: Tensor,
        num_iterations: int | list[int] | None = None,
        function_mask: Tensor | list[Tensor] | None = None,
        return_routing: bool = False,
    ) -> Tensor | NIOutput:
        """The logits ``(B, num_cls, num_outputs)`` of inputs ``x`` (images ``(B, C, H, W)`` or
        vectors ``(B, input_dim)``, per the tokenizer): a row per CLS token, one per task (the
        NAC and NFM give ``(B, num_outputs)``); with ``return_routing`` an
        :class:`NIOutput` with every script's compatibilities ``C`` and types. ``num_iterations``
        and ``function_mask`` (``(num_functions,)`` bool: which functions run) apply to every
        script, or take a list with one per script."""
        h = self.cls(self.tokenizer(check_input(x, self)))
        iters = self._per_script(num_iterations, "num_iterations")
        masks = self._per_script(function_mask, "function_mask")
        compats, types = [], []
        for script, n, mask in zip(self.scripts, iters, masks, strict=True):
            if return_routing:
                h, c, t = script(h, n, mask, return_routing=True)
                compats.append(c)
                types.append(t)
            else:
                h = script(h, n, mask)
        logits = self.heads(h[:, : self.config.num_cls])
        if return_routing:
            return NIOutput(logits, compats, types)
        return logits

    def add_functions(self, n: int, freeze_existing: bool = False, active: bool = True) -> None:
        """Add ``n`` functions to every script (see :meth:`Script.add_functions`); the config
        follows, so ``NeuralInterpreter(model.config)`` loads the model's ``state_dict``."""
        for script in self.scripts:
            script.add_functions(n, freeze_existing, active)
        self._config_follows()

    def remove_functions(self, indices) -> None:
        """Remove functions from every script (see :meth:`Script.remove_functions`); the config
        follows."""
        for script in self.scripts:
            script.remove_functions(indices)
        self._config_follows()

    def _config_follows(self) -> None:
        self.config = self.config.replace(num_functions=self.scripts[0].num_functions)
        for script in self.scripts:
            script.config = self.config
