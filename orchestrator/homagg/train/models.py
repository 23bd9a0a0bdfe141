"""Small versions of the paper's training workloads, with generated data.

Each model is a factory ``factory(rank, world_size, seed) -> (model,
batches, loss_fn)``, the same signature ``homagg train --model
path/to/file.py:factory`` takes for a user's own model:

- ``model``: a torch.nn.Module, initialised from ``seed`` alone (every rank
  builds the same one; DDP broadcasts rank 0's anyway);
- ``batches``: an endless iterator of ``(inputs, targets)`` for this rank
  (``inputs`` a tensor or a tuple of tensors passed as positional
  arguments), generated from (seed, rank): ranks see different data;
- ``loss_fn(outputs, targets)``: a scalar tensor.

Nothing is downloaded; every data set is generated here with numpy, with
structure a model can learn (the loss falls within a few steps).

- ``ncf``: neural collaborative filtering (user and item embeddings + MLP,
  He et al. 2017) on implicit feedback: users and positive items with Zipf
  popularity, items liked by a user's taste cluster, one uniform negative
  per positive, binary cross-entropy.  Embedding gradients are sparse: only
  the rows of the batch's users and items are non-zero.
- ``lstm``: a two-layer LSTM language model on a Zipf token stream with
  bigram structure (each token has a few likely successors).  Input
  embedding gradients are sparse, the softmax layer's dense.
- ``bert``: a BERT-like encoder (torch.nn.TransformerEncoder, random init)
  with a masked-token objective (15 % of the tokens masked) on the same
  kind of stream.
- ``vgg``: a VGG-like CNN (3x3 convolutions, max pooling, two linear
  layers) on 32x32 images of 10 classes (a class template plus noise):
  every gradient is dense, where compression cannot pay.

``MODELS`` maps the names to (factory, SGD learning rate).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _rng(seed, *stream):
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, *stream])


def _zipf_probs(n, a):
    p = 1.0 / np.arange(1, n + 1) ** a
    return p / p.sum()


# --------------------------------------------------------------------------
# NCF


class NCF(nn.Module):
    """Embedding outputs are multiplied by ``scale`` (weights initialised
    ``scale`` times smaller): with one SGD learning rate for the whole
    model, the rarely seen embedding rows then learn ``scale**2`` times
    faster than the shared MLP, as a per-table learning rate would do."""

    def __init__(self, users, items, dim=32, hidden=64, scale=32.0):
        super().__init__()
        self.scale = scale
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)
        self.mlp = nn.Sequential(
            nn.Linear(2 * dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden // 2), nn.ReLU()
        )
        self.out = nn.Linear(hidden // 2 + dim, 1)
        nn.init.normal_(self.user.weight, std=0.3 / scale)
        nn.init.normal_(self.item.weight, std=0.3 / scale)

    def forward(self, users, items):
        u, i = self.user(users) * self.scale, self.item(items) * self.scale
        gmf = u * i
        mlp = self.mlp(torch.cat([u, i], dim=1))
        return self.out(torch.cat([gmf, mlp], dim=1)).squeeze(1)


def ncf(rank, world_size, seed, users=100_000, items=20_000, batch=512, clusters=16):
    torch.manual_seed(seed)
    model = NCF(users, items)
    world = _rng(seed, 0)  # the same "world" on every rank: tastes, popularity
    user_p = _zipf_probs(users, 1.05)
    item_pop = _zipf_probs(items // clusters, 1.1)
    taste = world.integers(0, clusters, size=users)
    # items of cluster c: a fixed random permutation, cut in clusters
    perm = world.permutation(items).reshape(clusters, items // clusters)
    rng = _rng(seed, 1, rank)

    def gen():
        half = batch // 2
        while True:
            u = rng.choice(users, size=half, p=user_p)
            pos = perm[taste[u], rng.choice(items // clusters, size=half, p=item_pop)]
            neg = rng.integers(0, items, size=half)
            uu = np.concatenate([u, u])
            ii = np.concatenate([pos, neg])
            y = np.concatenate([np.ones(half), np.zeros(half)]).astype(np.float32)
            yield ((torch.from_numpy(uu), torch.from_numpy(ii)), torch.from_numpy(y))

    return model, gen(), nn.BCEWithLogitsLoss()


# --------------------------------------------------------------------------
# Token streams (LSTM, BERT)


def _token_stream(seed, rank, vocab, successors=4):
    """An endless Zipf token stream with bigram structure: a token's next is
    one of its ``successors`` likely tokens (Zipf-chosen), or with
    probability 0.2 a fresh Zipf draw."""
    world = _rng(seed, 2)
    p = _zipf_probs(vocab, 1.1)
    nxt = world.choice(vocab, size=(vocab, successors), p=p)
    rng = _rng(seed, 3, rank)
    tok = int(rng.choice(vocab, p=p))
    while True:
        block = np.empty(4096, dtype=np.int64)
        fresh = rng.choice(vocab, size=4096, p=p)
        pick = rng.integers(0, successors, size=4096)
        jump = rng.random(4096) < 0.2
        for j in range(4096):
            tok = int(fresh[j]) if jump[j] else int(nxt[tok, pick[j]])
            block[j] = tok
        yield from block


def _windows(stream, batch, length):
    while True:
        flat = np.fromiter(stream, dtype=np.int64, count=batch * (length + 1))
        yield flat.reshape(batch, length + 1)


class LSTMLM(nn.Module):
    def __init__(self, vocab, dim=128, hidden=128, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        h, _ = self.lstm(self.embed(tokens))
        return self.decoder(h)


def lstm(rank, world_size, seed, vocab=10_000, batch=16, length=20):
    torch.manual_seed(seed)
    model = LSTMLM(vocab)
    windows = _windows(_token_stream(seed, rank, vocab), batch, length)

    def gen():
        for w in windows:
            t = torch.from_numpy(w)
            yield t[:, :-1], t[:, 1:]

    ce = nn.CrossEntropyLoss()

    def loss_fn(logits, targets):
        return ce(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return model, gen(), loss_fn


class TinyBERT(nn.Module):
    def __init__(self, vocab, dim=128, heads=4, layers=2, ff=256, length=32):
        super().__init__()
        self.embed = nn.Embedding(vocab + 1, dim)  # the last id is [MASK]
        self.pos = nn.Parameter(torch.randn(length, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens) + self.pos[: tokens.shape[1]]))


def bert(rank, world_size, seed, vocab=8_000, batch=16, length=32, mask=0.15):
    torch.manual_seed(seed)
    model = TinyBERT(vocab, length=length)
    windows = _windows(_token_stream(seed, rank, vocab), batch, length - 1)
    rng = _rng(seed, 4, rank)

    def gen():
        for w in windows:
            t = torch.from_numpy(w)
            m = torch.from_numpy(rng.random(t.shape) < mask)
            m[:, 0] |= ~m.any(dim=1)  # at least one masked token per row
            inputs = t.masked_fill(m, vocab)
            targets = t.masked_fill(~m, -100)  # loss on masked positions only
            yield inputs, targets

    ce = nn.CrossEntropyLoss(ignore_index=-100)

    def loss_fn(logits, targets):
        return ce(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return model, gen(), loss_fn


# --------------------------------------------------------------------------
# VGG-like CNN


def _vgg_features(cfg):
    layers, c = [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU()]
            c = v
    return nn.Sequential(*layers), c


class VGGLike(nn.Module):
    def __init__(self, classes=10, cfg=(32, 32, "M", 64, 64, "M", 128, "M", 128, "M")):
        super().__init__()
        self.features, c = _vgg_features(cfg)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c * 2 * 2, 256), nn.ReLU(), nn.Linear(256, classes)
        )

    def forward(self, x):
        return self.classifier(self.features(x))


def vgg(rank, world_size, seed, batch=16, classes=10):
    torch.manual_seed(seed)
    model = VGGLike(classes)
    # class templates: 4x4 random patterns blown up to 32x32
    coarse = _rng(seed, 5).standard_normal((classes, 3, 4, 4)).astype(np.float32)
    templates = np.repeat(np.repeat(coarse, 8, axis=2), 8, axis=3)
    rng = _rng(seed, 6, rank)

    def gen():
        while True:
            y = rng.integers(0, classes, size=batch)
            x = templates[y] + rng.standard_normal((batch, 3, 32, 32)).astype(np.float32) * 1.0
            yield torch.from_numpy(x), torch.from_numpy(y)

    return model, gen(), nn.CrossEntropyLoss()


MODELS = {
    "ncf": (ncf, 2.0),
    "lstm": (lstm, 1.0),
    "bert": (bert, 0.1),
    "vgg": (vgg, 0.2),
}
