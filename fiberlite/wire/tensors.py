"""PyTorch tensors as out-of-band buffers, once torch is imported.

torch pickles a tensor by value through ``torch.save`` of its storage (several copies,
about ten times the cost of a numpy array's pickle); its faster reductions, registered
with ``multiprocessing``'s ``ForkingPickler``, send shared-memory handles that only
another process of the same machine can open. A plain tensor (exactly ``torch.Tensor``,
on the CPU, dense, contiguous, without autograd, the whole of its storage, of a dtype
numpy has) travels here as a numpy array does: its memory as an out-of-band buffer of
pickle protocol 5. Any other tensor (a ``Parameter``, a view into a larger storage, a
``bfloat16`` one...) keeps torch's own reduction.

One difference: two such tensors that share a storage and are sent in one message
arrive as two copies (torch's reduction keeps them shared).
"""
from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["reducer_if_imported"]

_registered = False


def _rebuild(array: Any) -> Any:
    import torch
    if not array.flags.writeable:  # a received message's memory: torch wants its own
        array = array.copy()
    return torch.from_numpy(array)


def _make_reducer(torch: Any) -> Callable[[Any], tuple]:
    plain = torch.Tensor
    strided = torch.strided
    numpy_dtypes = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128}

    def reduce(tensor: Any) -> tuple:
        if (type(tensor) is plain and tensor.layout is strided and tensor.device.type == "cpu"
                and tensor.dtype in numpy_dtypes and not tensor.requires_grad
                and not tensor.is_conj() and not tensor.is_neg() and tensor.is_contiguous()
                and tensor.storage_offset() == 0
                and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()):
            try:
                return _rebuild, (tensor.numpy(),)
            except (RuntimeError, TypeError):  # a kind numpy cannot view (named dimensions...)
                pass
        return tensor.__reduce_ex__(5)
    return reduce


def reducer_if_imported() -> tuple[type, Callable] | None:
    """``(torch.Tensor, its reducer)`` the first time it is asked after torch was
    imported; None before, and after (it is registered once)."""
    global _registered
    if _registered:
        return None
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return None
    _registered = True
    return torch.Tensor, _make_reducer(torch)
