"""Models larger than memory: weights offloaded to the CPU or to disk by accelerate's big-model loading.

A model loaded with a ``device_map`` that sends some blocks to ``"disk"`` (or to ``"cpu"`` beside a GPU) keeps
those blocks' parameters as meta tensors; accelerate's hooks load them when the block runs and drop them after. The
audit needs nothing more: it taps the attention calls as the model makes them, on each layer's own device. Bounds
need each layer's weights, and read them one layer at a time (:class:`LayerSequence`): a layer's parameters are
brought in (:func:`onloaded`) while its normalized weights are copied out, so no more than one offloaded block is
held at once, whatever the model's size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import overload

import torch

from attnsens.weights import LayerWeights


def is_offloaded(module: torch.nn.Module) -> bool:
    """Whether some parameter of ``module`` lives on the meta device (offloaded: loaded only while it runs)."""
    return any(parameter.device.type == "meta" for parameter in module.parameters())


def execution_device(module: torch.nn.Module) -> torch.device:
    """The device ``module`` computes on: its first parameter that is not offloaded, else the execution device of
    accelerate's hook on its first offloaded submodule, else the CPU."""
    for parameter in module.parameters():
        if parameter.device.type != "meta":
            return parameter.device
    for submodule in module.modules():
        hook = getattr(submodule, "_hf_hook", None)
        device = getattr(hook, "execution_device", None)
        if device is not None:
            return torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    return torch.device("cpu")


@contextlib.contextmanager
def onloaded(module: torch.nn.Module) -> Iterator[None]:
    """The parameters of ``module``'s offloaded submodules, loaded on their execution devices while the context is
    open and dropped after it (accelerate's ``align_module_device`` on each)."""
    from accelerate.utils import align_module_device, has_offloaded_params

    with contextlib.ExitStack() as stack:
        for submodule in module.modules():
            if has_offloaded_params(submodule):
                stack.enter_context(align_module_device(submodule))
        yield


class LayerSequence(Sequence[LayerWeights]):
    """Normalized weights of an offloaded model, read layer by layer as they are asked for (nothing is kept):
    ``read(i)`` is called inside :func:`onloaded` of block i."""

    def __init__(
        self,
        blocks: Sequence[torch.nn.Module],
        read: Callable[[int], LayerWeights],
        then: Callable[[LayerWeights], LayerWeights] | None = None,
    ) -> None:
        self._blocks, self._read, self._then = blocks, read, then

    def mapped(self, then: Callable[[LayerWeights], LayerWeights]) -> LayerSequence:
        """The same layers, each passed through ``then`` as it is read."""
        before = self._then
        return LayerSequence(self._blocks, self._read, then if before is None else lambda layer: then(before(layer)))

    def __len__(self) -> int:
        return len(self._blocks)

    @overload
    def __getitem__(self, index: int) -> LayerWeights: ...

    @overload
    def __getitem__(self, index: slice) -> list[LayerWeights]: ...

    def __getitem__(self, index: int | slice) -> LayerWeights | list[LayerWeights]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"layer {index} of {len(self)}")
        with torch.no_grad(), onloaded(self._blocks[index]):
            layer = self._read(index)
        return layer if self._then is None else self._then(layer)
