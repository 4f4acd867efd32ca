"""Image augmentation for training (NAC App. C's Tiny-ImageNet recipe, scaled per profile), and the
ImageNet normalisation the models see."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from modnets.data.tiny_imagenet_cache import IMAGE_SIZE

IMAGENET_MEAN = (0.485, 0.456, 0.406)

IMAGENET_STD = (0.229, 0.224, 0.225)

AUGMENT_PROFILES = ("smoke", "cpu", "gpu")


def _to_float(x: Tensor) -> Tensor:
    """uint8 ``[0, 255]`` -> float32 ``[0, 1]``; floating tensors are taken to be in ``[0, 1]``."""
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)
    if not x.is_floating_point():
        raise TypeError(f"expected a uint8 or floating tensor, got {x.dtype}")
    return x


def _stats(x: Tensor) -> tuple[Tensor, Tensor]:
    mean = torch.tensor(IMAGENET_MEAN, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return mean, std


def normalize(x: Tensor) -> Tensor:
    """uint8 or ``[0, 1]`` float images ``(B, 3, H, W)`` -> ImageNet-normalised floats."""
    x = _to_float(x)
    mean, std = _stats(x)
    return (x - mean) / std


def denormalize(x: Tensor) -> Tensor:
    """Inverse of :func:`normalize`: floats in ``[0, 1]`` (clamped), e.g. for plotting."""
    mean, std = _stats(x)
    return (x * std + mean).clamp(0, 1)


class TinyImageNetAugment(nn.Module):
    """Batch-wise training augmentation for ``(B, 3, H, W)`` uint8 or ``[0, 1]`` float images.

    Random resized crop to ``size`` (``scale`` of the area), horizontal flip, and at the ``gpu``
    profile kornia's RandAugment ``(n, m) = (2, 9)`` (``randaugment`` overrides; ``(0, 0)`` turns it
    off), then ImageNet normalisation (``normalize=False``: ``[0, 1]`` floats). ``profile=None``
    uses :func:`modnets.profiles.get_profile`.

    MixUp / CutMix: with ``mixup > 0`` or ``cutmix > 0`` a batch gets MixUp with probability
    ``mixup``, else CutMix with probability ``cutmix`` (kornia's ``RandomMixUpV2`` with
    ``lambda_val=mixup_lambda`` / ``RandomCutMixV2``). ``forward(x, y)`` with int labels ``y``
    returns ``(x, soft_targets)``, soft targets ``(B, num_classes)`` summing to 1 (one-hot when the
    batch was not mixed), usable with ``F.cross_entropy(logits, soft_targets)``; ``forward(x)``
    returns the images only (and requires that no mixing is configured).

    Randomness comes from torch's global generator: ``torch.manual_seed`` makes it reproducible.
    """

    def __init__(
        self,
        profile: str | None = None,
        *,
        size: int = IMAGE_SIZE,
        scale: tuple[float, float] = (0.35, 1.0),
        flip: bool = True,
        randaugment: tuple[int, int] | None = None,
        normalize: bool = True,
        mixup: float = 0.0,
        cutmix: float = 0.0,
        mixup_lambda: tuple[float, float] = (0.0, 0.5),
        num_classes: int | None = None,
    ):
        super().__init__()
        import kornia.augmentation as K

        from modnets.profiles import get_profile

        self.profile = get_profile(profile)
        if randaugment is None:
            randaugment = (2, 9) if self.profile == "gpu" else (0, 0)
        if not (0 <= mixup <= 1 and 0 <= cutmix <= 1 and mixup + cutmix <= 1):
            raise ValueError(
                f"mixup={mixup} and cutmix={cutmix} must be probabilities summing to at most 1"
            )
        if (mixup or cutmix) and not num_classes:
            raise ValueError("num_classes is needed for mixup/cutmix soft targets")
        ops: list[nn.Module] = [K.RandomResizedCrop((size, size), scale=scale)]
        if flip:
            ops.append(K.RandomHorizontalFlip())
        self.geometric = nn.Sequential(*ops)
        self.randaugment = None
        if randaugment[0] > 0:
            from kornia.augmentation.auto import RandAugment

            self.randaugment = RandAugment(n=randaugment[0], m=randaugment[1])
        self.normalize = normalize
        self.mixup_p, self.cutmix_p, self.num_classes = float(mixup), float(cutmix), num_classes
        self.mixup = K.RandomMixUpV2(lambda_val=mixup_lambda, data_keys=["input", "class"])
        self.cutmix = K.RandomCutMixV2(data_keys=["input", "class"], use_correct_lambda=True)

    def forward(self, x: Tensor, y: Tensor | None = None):
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"expected images (B, 3, H, W), got shape {tuple(x.shape)}")
        mixing = self.mixup_p > 0 or self.cutmix_p > 0
        if mixing and y is None:
            raise ValueError("mixup/cutmix are configured: call with labels, augment(x, y)")
        x = self.geometric(_to_float(x))
        if self.randaugment is not None:
            x = self.randaugment(x).clamp(0, 1)
        if self.normalize:
            mean, std = _stats(x)
            x = (x - mean) / std
        if y is None:
            return x
        if not self.num_classes:
            raise ValueError(
                "num_classes is needed to return soft targets: pass it to the constructor"
            )
        soft = self._one_hot(y, x.dtype)
        if mixing:
            u = float(torch.rand(()))
            if u < self.mixup_p:
                x, mix = self.mixup(x, y)  # mix: (B, 3) = (y, y_paired, weight of y_paired)
                a, b, lam = mix[:, 0], mix[:, 1], mix[:, 2]
            elif u < self.mixup_p + self.cutmix_p:
                x, mix = self.cutmix(x, y)  # mix: (1, B, 3) = (y, y_paired, weight of y)
                a, b, lam = mix[0, :, 0], mix[0, :, 1], 1 - mix[0, :, 2]
            else:
                return x, soft
            lam = lam.to(x.dtype).unsqueeze(1)
            soft = (1 - lam) * self._one_hot(a, x.dtype) + lam * self._one_hot(b, x.dtype)
        return x, soft

    def _one_hot(self, labels: Tensor, dtype: torch.dtype) -> Tensor:
        return torch.nn.functional.one_hot(labels.long(), self.num_classes).to(dtype)


_AUGMENTERS: dict[tuple, TinyImageNetAugment] = {}


def train_augment(x: Tensor, profile: str | None = None, y: Tensor | None = None, **kwargs):
    """Functional :class:`TinyImageNetAugment`: ``train_augment(x, "cpu")`` -> images, or
    ``train_augment(x, "gpu", y, mixup=0.5, cutmix=0.5, num_classes=20)`` -> (images, soft targets).
    The module for each distinct set of arguments is built once and reused."""
    from modnets.profiles import get_profile

    key = (get_profile(profile), tuple(sorted(kwargs.items())))
    if key not in _AUGMENTERS:
        _AUGMENTERS[key] = TinyImageNetAugment(key[0], **kwargs)
    aug = _AUGMENTERS[key]
    return aug(x) if y is None else aug(x, y)
