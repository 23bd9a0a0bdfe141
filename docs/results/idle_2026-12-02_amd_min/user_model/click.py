"""A user's click model, written as users write them: layers first, seed later."""
import torch


class Click(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(600_000, 8, mode="sum")
        self.head = torch.nn.Linear(8, 1)

    def forward(self, ids):
        return self.head(self.emb(ids)).squeeze(1)


def factory(rank, world_size, seed):
    net = Click()  # not seeded: every rank builds other weights; DDP broadcasts rank 0's
    torch.manual_seed(seed * 1000 + rank)
    g = torch.Generator().manual_seed(seed * 100 + rank)

    def batches():
        while True:
            ids = torch.randint(0, 600_000, (540, 4), generator=g)
            yield ids, torch.randint(0, 2, (540,), generator=g).float()

    return net, batches(), torch.nn.BCEWithLogitsLoss()
