"""PyTorch's DataLoader on fiberlite: its workers are fiberlite jobs (given a fiberlite
context, which is a multiprocessing context), its batches those of num_workers=0."""
import torch
from torch.utils.data import DataLoader, Dataset

import fiberlite


class Noisy(Dataset):
    """Item i: a deterministic 'sample' and its label."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        generator = torch.Generator().manual_seed(i)
        return torch.randn(4, generator=generator), i % 2


if __name__ == "__main__":
    reference = list(DataLoader(Noisy(), batch_size=16))
    loader = DataLoader(Noisy(), batch_size=16, num_workers=2,
                        multiprocessing_context=fiberlite.get_context())
    batches = list(loader)
    same = all(torch.equal(a, c) and torch.equal(b, d)
               for (a, b), (c, d) in zip(batches, reference))
    print(f"{len(batches)} batches from 2 fiberlite workers, the same as num_workers=0: {same}")
