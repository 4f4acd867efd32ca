"""The convolutional network NFM sits in (NFM §4's CNN): plain or pre-activation residual blocks,
stage by stage."""

from __future__ import annotations

import copy

import torch.nn.functional as F
from torch import Tensor, nn

from modnets.models.nfm.network import NFMNetwork
from modnets.pretrained import Pretrained
from modnets.utils import check_input, positive_int

BLOCKS = ("plain", "preact")

POOLS = ("flatten", "max", "mean")


class _PlainBlock(nn.Sequential):
    """App. C's CNN stage: a stride-2 3x3 convolution that doubles the channels, then a 3x3
    convolution, each followed by ReLU (no batch norm, as App. C removes it)."""

    def __init__(self, cin: int, cout: int):
        super().__init__(
            nn.Conv2d(cin, cout, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1),
            nn.ReLU(),
        )


class _PreActBlock(nn.Module):
    """A pre-activation residual block (He et al., 2016) that halves the resolution:
    ``x -> shortcut(x) + conv(relu(bn(conv_s2(relu(bn(x))))))``, the shortcut a strided 1x1
    convolution. ``norm=False`` drops the batch norms."""

    def __init__(self, cin: int, cout: int, norm: bool = True):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin) if norm else nn.Identity()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=not norm)
        self.bn2 = nn.BatchNorm2d(cout) if norm else nn.Identity()
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=not norm)
        self.shortcut = nn.Conv2d(cin, cout, 1, stride=2, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn1(x))
        return self.shortcut(h) + self.conv2(F.relu(self.bn2(self.conv1(h))))


class ConvNet(nn.Module, Pretrained):
    """NFM App. C's CNN for stacked MNIST, optionally with NFM: NFM(CNN).

    A 3x3 stem convolution with ``width`` channels at full resolution, then ``num_blocks`` stages
    that each halve the resolution and double the channels (``block="plain"``: stride-2 conv +
    conv, App. C's nine-layer CNN for 4 stages; ``"preact"``: pre-activation residual blocks),
    then a linear head on the final map: flattened (``pool="flatten"``), or its global maximum
    (``"max"``) or mean (``"mean"``) per channel. With ``nfm`` (a dict of :class:`NFMNetwork`
    arguments, e.g. ``{"passes": 2, "top_k": 5}``) the stages run as Algorithm 1's modules and
    the stem's output is ``x = h(0)`` (the stem reads nothing, so it runs once). By default an
    NFM read sits after every stage (``placement="after"``, "NFM after each block" as in NFM
    App. B): four reads per pass at 1/2 .. 1/16 of the resolution, eight in all for ``K = 2``
    as in NFM §4.2 (the first has an empty memory). ``placement="before"`` reads after the stem
    and after each stage but the last instead (Algorithm 1 with ``x`` the stem's output, as NFM
    App. F's GAN).

    Shapes: images ``(B, in_channels, image_size, image_size)`` -> logits ``(B, num_outputs)``.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_outputs: int = 10,
        width: int = 32,
        num_blocks: int = 4,
        image_size: int = 64,
        block: str = "plain",
        norm: bool = False,
        pool: str = "flatten",
        nfm: dict | None = None,
    ):
        super().__init__()
        for name, v in (
            ("in_channels", in_channels),
            ("num_outputs", num_outputs),
            ("width", width),
            ("num_blocks", num_blocks),
            ("image_size", image_size),
        ):
            positive_int(v, name)
        if block not in BLOCKS:
            raise ValueError(f"block must be one of {BLOCKS}, got {block!r}")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        if image_size % 2**num_blocks:
            raise ValueError(
                f"image_size={image_size} must be divisible by 2**num_blocks={2**num_blocks}"
            )
        self.in_channels, self.image_size = in_channels, image_size
        self._arguments = dict(
            in_channels=in_channels,
            num_outputs=num_outputs,
            width=width,
            num_blocks=num_blocks,
            image_size=image_size,
            block=block,
            norm=norm,
            pool=pool,
        )
        self.dims = tuple(width * 2**i for i in range(num_blocks + 1))
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU())
        make = (
            (lambda a, b: _PlainBlock(a, b))
            if block == "plain"
            else (lambda a, b: _PreActBlock(a, b, norm))
        )
        stages = [make(self.dims[i], self.dims[i + 1]) for i in range(num_blocks)]
        for m in [self.stem, *stages]:
            for conv in m.modules():
                if isinstance(conv, nn.Conv2d):  # He init: nine plain ReLU layers, no batch norm
                    nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
                    if conv.bias is not None:
                        nn.init.zeros_(conv.bias)
        self.body = nn.Sequential(*stages) if nfm is None else self._nfm(stages, nfm)
        final = image_size // 2**num_blocks
        self.pool = pool
        features = self.dims[-1] * (final * final if pool == "flatten" else 1)
        self.head = nn.Linear(features, num_outputs)
        self.nfm_config = None if nfm is None else dict(nfm)

    def arguments(self) -> dict:
        return {**self._arguments, "nfm": self.nfm_config}

    def _nfm(self, stages, nfm: dict) -> NFMNetwork:
        return NFMNetwork(stages, self.dims, **{"placement": "after", **nfm})

    @property
    def nfm(self) -> NFMNetwork | None:
        return self.body if isinstance(self.body, NFMNetwork) else None

    def with_nfm(self, **nfm) -> ConvNet:
        """A copy with NFM added around this network's stages. With ``gamma = 0`` (the
        initialisation) it computes exactly what this network computes, so NFM can be added to a
        trained model and trained on from there."""
        if self.nfm is not None:
            raise ValueError("this ConvNet already has NFM")
        new = copy.deepcopy(self)
        new.body = new._nfm(list(new.body), nfm)
        new.nfm_config = dict(nfm)
        return new

    def forward(self, x: Tensor, return_details: bool = False):
        """The logits ``(B, num_outputs)`` of images ``x`` ``(B, in_channels, H, W)``; with
        ``return_details`` (NFM only) also the body's :class:`NFMOutput` (reads, states)."""
        h0 = self.stem(self._check_shape(check_input(x, self)))
        if return_details:
            if self.nfm is None:
                raise ValueError("return_details needs a ConvNet with NFM")
            out = self.body(h0, return_details=True)
            return self._head(out.output), out
        return self._head(self.body(h0))

    def _check_shape(self, x: Tensor) -> Tensor:
        """``x`` when it is a batch of images this network reads: ``(B, in_channels, H, W)``,
        ``H = W = image_size`` where the head reads the flattened map (its size is fixed)."""
        size = self.image_size
        expected = f"(B, {self.in_channels}, {size}, {size})"
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"x must have shape {expected}, got {tuple(x.shape)}")
        if self.pool == "flatten" and tuple(x.shape[-2:]) != (size, size):
            raise ValueError(
                f"x must have shape {expected} (the flattened head reads a fixed-size map), "
                f"got {tuple(x.shape)}"
            )
        return x

    def _head(self, h: Tensor) -> Tensor:
        if self.pool == "max":
            h = h.amax((2, 3))
        elif self.pool == "mean":
            h = h.mean((2, 3))
        return self.head(h.flatten(1))
