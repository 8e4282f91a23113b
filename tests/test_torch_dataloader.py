"""PyTorch's DataLoader on a fiberlite context: its workers are jobs, its batches those of
``num_workers=0``; tensors travel by value (never as torch's shared-memory handles)."""
from __future__ import annotations

import gc
import multiprocessing.context
import pickle
import sys

import cloudpickle
import pytest

import fiberlite
from fiberlite.wire.pickling import dumps, dumps_bytes, loads

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

pytestmark = pytest.mark.timeout(120)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Squares(Dataset):
    """Item i: a tensor of i squared, i, and whether it was made in a fiberlite job."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        in_job = fiberlite.parent_process() is not None
        return torch.full((3,), float(i)) ** 2, i, in_job


def batches(loader) -> list:
    return [(values.clone(), indices.clone()) for values, indices, _ in loader]


def same(got: list, expected: list) -> bool:
    return len(got) == len(expected) and all(
        torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, expected))


def test_fiberlite_contexts_are_multiprocessing_contexts():
    for ctx in (fiberlite.get_context(), fiberlite.get_context("local"), fiberlite.get_context("spawn")):
        assert isinstance(ctx, multiprocessing.context.BaseContext)
    assert fiberlite.get_context().Queue.__func__ is fiberlite.BaseContext.Queue


def _tensors() -> dict:
    base = torch.arange(24.0).reshape(4, 6)
    return {"float32": base.clone(), "int64": torch.arange(5), "bool": torch.tensor([True, False]),
            "0-dim": torch.tensor(3.5), "empty": torch.empty(0, 3), "a view": base[1:3],
            "transposed": base.t(), "bfloat16": base.to(torch.bfloat16),
            "requires grad": torch.ones(3, requires_grad=True),
            "Parameter": torch.nn.Parameter(torch.ones(2)), "shared": base.clone().share_memory_()}


def test_tensors_of_every_kind_travel_by_value():
    for kind, tensor in _tensors().items():
        data, buffers = dumps(tensor)
        back = loads(data, buffers)
        assert type(back) is type(tensor) and back.dtype == tensor.dtype, kind
        assert back.shape == tensor.shape and torch.equal(back.detach(), tensor.detach()), kind
        assert back.requires_grad == tensor.requires_grad, kind
    data, buffers = dumps(torch.zeros(64, 1024))
    assert len(buffers) == 1  # a plain tensor's memory travels out of band, as an array's does
    back = loads(data, [bytes(b) for b in buffers])  # read-only memory, as a received message's
    back += 1  # the loaded tensor owns writable memory
    assert float(back.sum()) == 64 * 1024


def test_a_shared_memory_tensor_pickles_by_value():
    tensor = torch.arange(12.0).reshape(3, 4).share_memory_()
    data = dumps_bytes(tensor)
    assert b"rebuild_storage" not in data  # torch's file-descriptor reduction is not used
    assert torch.equal(pickle.loads(data), tensor)


def test_persistent_workers_yield_the_batches_of_num_workers_0_each_epoch():
    """(workers started for each epoch: tests/test_examples.py, torch_dataloader.py)"""
    expected = batches(DataLoader(Squares(), batch_size=8))
    loader = DataLoader(Squares(), batch_size=8, num_workers=2, persistent_workers=True,
                        multiprocessing_context=fiberlite.get_context())
    for _ in range(2):
        epoch = list(loader)
        assert all(in_job.all() for _, _, in_job in epoch)  # made in the workers, fiberlite jobs
        assert same(batches(epoch), expected)
    del loader, epoch  # the workers are told to stop (persistent ones when the loader goes)
    gc.collect()
    assert fiberlite.active_children() == []
